package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/systest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// TestKeyWrittenBehindTheGatewaysBack: a connection key write whose
// acknowledgement the gateway never got (a timeout while NATS was slow) may
// still have been stored, leaving the key at a revision the gateway does
// not know. The gateway must take that revision and go on refreshing the
// key; otherwise the key expires under a live socket and watchers see a
// false offline.
func TestKeyWrittenBehindTheGatewaysBack(t *testing.T) {
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "watcher")
	a := sys.Dial(gw, "alice")
	defer systest.KeepAlive(a, systest.Heartbeat)()
	w := sys.Dial(gw, "watcher")
	defer systest.KeepAlive(w, systest.Heartbeat)()
	view := systest.NewView(t, w)
	if err := w.Subscribe("w", "alice"); err != nil {
		t.Fatal(err)
	}
	view.Await("alice", presence.Online)

	// The lost write: the key written again on its current revision, as
	// the gateway's own refresh would have been.
	ctx := context.Background()
	connID := a.Hello.ConnID
	var lost uint64
	for lost == 0 {
		rec, rev, err := sys.Store.Conn(ctx, "alice", connID)
		if err != nil {
			t.Fatalf("alice's key: %v", err)
		}
		lost, err = sys.Store.WriteConn(ctx, "alice", connID, rec, systest.TTL, rev)
		if err != nil && !presence.IsWrongLastSequence(err) {
			t.Fatal(err)
		}
		// A refresh of the gateway's landed in between: read again.
	}

	// Four TTLs: the key written behind the gateway's back would have
	// expired four times over had the gateway not taken its revision.
	for _, m := range stillOpen(t, w, time.Now().Add(4*systest.TTL)) {
		if m.Type != protocol.TypePresenceBatch {
			continue
		}
		for _, p := range m.Updates {
			if p.UserID == "alice" && p.Status != presence.Online {
				t.Fatalf("watcher told alice is %s while her socket is live: %+v", p.Status, p)
			}
		}
	}
	_, rev, err := sys.Store.Conn(ctx, "alice", connID)
	if err != nil {
		t.Fatalf("alice's key after %v: %v", 4*systest.TTL, err)
	}
	if rev <= lost {
		t.Errorf("alice's key is at revision %d, not refreshed since the lost write (%d)", rev, lost)
	}
	if rec, err := sys.StatusOf("alice"); err != nil || rec.Status != presence.Online {
		t.Errorf("alice's record: %+v, %v; want online", rec, err)
	}
}
