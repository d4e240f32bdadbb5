package gateway_test

import (
	"testing"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

func TestTwoUsersSeeEachOther(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")

	alice := sys.Dial(gw, "alice", "web")
	if alice.Hello.UserID != "alice" || alice.Hello.ConnID == "" || alice.Hello.Status != presence.Online {
		t.Fatalf("hello = %+v", alice.Hello)
	}
	stopA := systest.KeepAlive(alice, systest.Heartbeat)
	defer stopA()
	if err := alice.Subscribe("s1", "bob"); err != nil {
		t.Fatal(err)
	}
	init := systest.Await(t, alice, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit
	})
	if init.ID != "s1" || len(init.Users) != 1 || init.Users[0].Status != presence.Offline {
		t.Fatalf("init = %+v", init)
	}

	bob := sys.Dial(gw, "bob")
	stopB := systest.KeepAlive(bob, systest.Heartbeat)
	systest.AwaitStatus(t, alice, "bob", presence.Online)

	if err := bob.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Busy)
	systest.AwaitSelf(t, bob, presence.Busy, 1)

	if err := bob.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Offline)
	systest.AwaitSelf(t, bob, presence.Invisible, 1)

	if err := bob.SetStatus("online"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Online)

	stopB()
	if err := bob.Close(); err != nil {
		t.Fatal(err)
	}
	p := systest.AwaitStatus(t, alice, "bob", presence.Offline)
	if p.LastSeen == 0 {
		t.Errorf("offline bob has no last_seen: %+v", p)
	}
}
