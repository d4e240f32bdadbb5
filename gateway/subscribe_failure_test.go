package gateway_test

import (
	"context"
	"slices"
	"testing"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// TestSubscribeFailureChangesNothing: a subscribe answered with error
// unavailable leaves the socket's subscriptions as they were, as
// protocol.md says ("nothing changed, and the client may retry"): one it
// had before, named again in the subscribe, still brings its user's
// changes, and the new ones it named are not kept.
func TestSubscribeFailureChangesNothing(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{NoFanout: true})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob", "carol")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	subscribe(t, alice, "s1", "bob")

	// carol's record cannot be read, which fails the snapshot of the next
	// subscribe as a read that times out would. (No fanout: it would
	// choke on the record too.)
	kv, err := sys.Store.JetStream().KeyValue(context.Background(), presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), "carol", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if err := alice.Subscribe("s2", "bob", "carol"); err != nil {
		t.Fatal(err)
	}
	m := systest.Await(t, alice, systest.EventTimeout, "answer to s2", func(m protocol.ServerMessage) bool {
		return m.ID == "s2"
	})
	if m.Type != protocol.TypeError || m.Code != protocol.CodeUnavailable {
		t.Fatalf("answer to s2 %+v, want error unavailable", m)
	}
	if got := gw.WatchedBy("alice", alice.Hello.ConnID); !slices.Equal(got, []string{"bob"}) {
		t.Errorf("after the failed subscribe alice watches %v, want [bob] as before", got)
	}
	bob := sys.Dial(gw, "bob")
	defer systest.KeepAlive(bob, systest.Heartbeat)()
	systest.AwaitStatus(t, alice, "bob", presence.Online)
}
