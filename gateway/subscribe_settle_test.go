package gateway_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/systest"
	"github.com/greendot/greendot/pkg/protocol"
)

// TestRevokedWhileSubscribing: a subscription revoked while its subscribe
// is being answered is not in the presence_init that follows its denied
// (protocol.md: after denied, none of the target's state is sent).
func TestRevokedWhileSubscribing(t *testing.T) {
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	alice := sys.Dial(gw, "alice")
	t.Cleanup(systest.KeepAlive(alice, systest.Heartbeat))

	// Once alice's snapshot of bob is read, bob unfollows her, and her
	// subscribe waits until she has the denied.
	denied := make(chan struct{})
	gateway.AfterSnapshot(t, "alice", sync.OnceFunc(func() {
		if err := sys.Store.Unfollow(context.Background(), "bob", "alice"); err != nil {
			t.Error(err)
		}
		select {
		case <-denied:
		case <-time.After(systest.EventTimeout):
			t.Error("alice was not denied bob while her subscribe waited")
		}
	}))
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, alice, systest.EventTimeout, "denied bob", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeDenied && m.UserID == "bob"
	})
	close(denied)
	m := systest.Await(t, alice, systest.EventTimeout, "presence_init s", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "s"
	})
	if p, ok := presenceOf(m, "bob"); ok {
		t.Errorf("presence_init after the denied of bob shows bob: %+v", p)
	}
}
