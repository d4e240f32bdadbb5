package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// leaseOf returns the key of a gateway's lease, and its record.
func leaseOf(t *testing.T, sys *systest.System, gatewayID string) (string, presence.LeaseRecord) {
	t.Helper()
	leases, err := sys.Store.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for k, l := range leases {
		if strings.HasPrefix(k, gatewayID+".") {
			return k, l
		}
	}
	t.Fatalf("gateway %s holds no lease: %v", gatewayID, leases)
	return "", presence.LeaseRecord{}
}

// aliceWatched starts a system with one gateway, and alice and a watcher
// who watches her, both heartbeating until the test ends; alice is seen
// online.
func aliceWatched(t *testing.T) (*systest.System, *systest.Gateway, *client.Conn, *client.Conn, *systest.View) {
	t.Helper()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "watcher")
	a := sys.Dial(gw, "alice")
	t.Cleanup(systest.KeepAlive(a, systest.Heartbeat))
	w := sys.Dial(gw, "watcher")
	t.Cleanup(systest.KeepAlive(w, systest.Heartbeat))
	view := systest.NewView(t, w)
	if err := w.Subscribe("w", "alice"); err != nil {
		t.Fatal(err)
	}
	view.Await("alice", presence.Online)
	return sys, gw, a, w, view
}

// TestLeaseWrittenBehindTheGatewaysBack: a lease refresh whose
// acknowledgement the gateway never got (a timeout while NATS was slow)
// may still have been stored, leaving the lease at a revision the gateway
// does not know. The gateway must take that revision and go on refreshing
// the lease; taking it for lost would register every connection again, and
// left to expire it would show every user offline.
func TestLeaseWrittenBehindTheGatewaysBack(t *testing.T) {
	t.Parallel()
	sys, gw, _, w, _ := aliceWatched(t)

	// The lost write: the lease written again on its current revision, as
	// the gateway's own refresh would have been.
	ctx := context.Background()
	_, lease := leaseOf(t, sys, gw.ID())
	var lost uint64
	for lost == 0 {
		_, rev, err := sys.Store.Lease(ctx, lease.Gateway, lease.Epoch)
		if err != nil {
			t.Fatalf("the gateway's lease: %v", err)
		}
		msg, err := presence.LeaseMsg(&lease)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := sys.Store.JetStream().PublishMsg(ctx, msg, presence.RefreshOpts(systest.TTL, rev)...)
		if err != nil && !presence.IsWrongLastSequence(err) {
			t.Fatal(err)
		}
		if err == nil {
			lost = ack.Sequence
		}
		// A refresh of the gateway's landed in between: read again.
	}

	// Four TTLs: the lease written behind the gateway's back would have
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
	_, rev, err := sys.Store.Lease(ctx, lease.Gateway, lease.Epoch)
	if err != nil {
		t.Fatalf("the gateway's lease after %v: %v", 4*systest.TTL, err)
	}
	if rev <= lost {
		t.Errorf("the lease is at revision %d, not refreshed since the lost write (%d)", rev, lost)
	}
	if n := metricValue(t, gw, "greendot_gateway_leases_lost_total", nil); n != 0 {
		t.Errorf("the gateway took its lease for lost %v times", n)
	}
	if rec, err := sys.StatusOf("alice"); err != nil || rec.Status != presence.Online {
		t.Errorf("alice's record: %+v, %v; want online", rec, err)
	}
}

// TestWriteAfterCacheDropped: a user's writer drops its copy of the record
// once the user has not been written for a while. The next write reads
// the record first, so what another writer did meanwhile (another
// gateway of the same user, here the operator) is kept, and the change is
// written and seen.
func TestWriteAfterCacheDropped(t *testing.T) {
	t.Parallel()
	sys, gw, a, _, view := aliceWatched(t)

	if n := gw.DropIdleCaches(); n != 2 {
		t.Errorf("dropped %d copies, want 2 (alice's and the watcher's)", n)
	}
	if n := gw.DropIdleCaches(); n != 0 {
		t.Errorf("dropped %d copies the second time, want none", n)
	}
	// Another writer adds a connection of alice's behind the gateway's
	// back.
	ctx := context.Background()
	_, _, _, err := sys.Store.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
		r.SetConn("elsewhere", presence.ConnInfo{Gateway: "gw-other", Lease: "E1", Since: time.Now().UnixMilli()})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetStatus(string(presence.Busy)); err != nil {
		t.Fatal(err)
	}
	view.Await("alice", presence.Busy)
	rec, err := sys.StatusOf("alice")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != presence.Busy || len(rec.Conns) != 2 {
		t.Errorf("alice's record %+v: want busy with both connections", rec)
	}
}
