package reaper_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
)

// takeLease does what a gateway does when it starts: it takes a lease with
// the given TTL. It returns the lease's revision.
func (w *world) takeLease(gw, epoch string, ttl time.Duration) uint64 {
	w.t.Helper()
	rev, err := w.store.CreateLease(context.Background(), presence.LeaseRecord{Gateway: gw, Epoch: epoch, Started: time.Now().UnixMilli()}, ttl)
	if err != nil {
		w.t.Fatal(err)
	}
	return rev
}

// register does what a gateway does for a new connection under its lease:
// it creates the key, then adds the connection to the user's record.
func (w *world) register(gw, epoch, user, conn string) {
	w.t.Helper()
	key := presence.LeaseConn{Gateway: gw, Epoch: epoch, UserID: user, ConnID: conn}
	if _, err := w.store.CreateLeaseConn(context.Background(), key, presence.ConnRecord{Gateway: gw, Lease: epoch}); err != nil {
		w.t.Fatal(err)
	}
	w.setConn(user, conn, presence.ConnInfo{Gateway: gw, Lease: epoch, Since: time.Now().UnixMilli()})
}

// leaseConns returns how many keys are held under a lease.
func (w *world) leaseConns(gw, epoch string) int {
	w.t.Helper()
	conns, err := w.store.LeaseConns(context.Background(), gw, epoch)
	if err != nil {
		w.t.Fatal(err)
	}
	return len(conns)
}

// TestLeaseEndEndsItsConnections: a gateway dies (its lease expires): every
// connection held under the lease ends, and its keys go; the connections
// of another gateway, and of another lease of the same gateway, stay.
func TestLeaseEndEndsItsConnections(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	w.startReaper(reaper.Config{})
	events, err := w.nc.SubscribeSync(presence.EventSubject("alice"))
	if err != nil {
		t.Fatal(err)
	}

	w.takeLease("gw1", "E1", time.Second)
	w.takeLease("gw1", "E2", time.Hour) // the same gateway, a later lease
	w.takeLease("gw2", "F1", time.Hour)
	w.register("gw1", "E1", "alice", "a1")
	w.register("gw1", "E1", "bob", "b1")
	w.register("gw1", "E2", "bob", "b2")
	w.register("gw2", "F1", "carol", "c1")
	w.register("gw1", "E1", "carol", "c2")

	w.await("alice", presence.Offline)
	w.await("bob", presence.Online, "b2")
	w.await("carol", presence.Online, "c1")
	natstest.CheckFor(t, patience, 20*time.Millisecond, func() error {
		if n := w.leaseConns("gw1", "E1"); n != 0 {
			return fmt.Errorf("%d keys left under the ended lease", n)
		}
		return nil
	})
	if n := w.leaseConns("gw1", "E2") + w.leaseConns("gw2", "F1"); n != 2 {
		t.Errorf("%d keys under the live leases, want 2", n)
	}
	// The reaper published alice's going offline itself.
	natstest.CheckFor(t, patience, time.Millisecond, func() error {
		m, err := events.NextMsg(time.Second)
		if err != nil {
			return err
		}
		var ev presence.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil || ev.Status != presence.Offline {
			return fmt.Errorf("event %s", m.Data)
		}
		return nil
	})
}

// TestLeaseEndLeavesTheNextLease: a gateway that lost its lease took a new
// one and registered a connection again under it before the reaper saw
// the old lease end: the connection stays.
func TestLeaseEndLeavesTheNextLease(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	w.startReaper(reaper.Config{})
	w.takeLease("gw1", "E1", time.Second)
	w.register("gw1", "E1", "alice", "a1")
	w.takeLease("gw1", "E2", time.Hour)
	w.register("gw1", "E2", "alice", "a1") // the same connection, again
	natstest.CheckFor(t, patience, 20*time.Millisecond, func() error {
		if _, _, err := w.store.Lease(context.Background(), "gw1", "E1"); !errors.Is(err, presence.ErrNotFound) {
			return errors.New("E1 has not ended yet")
		}
		if n := w.leaseConns("gw1", "E1"); n != 0 {
			return fmt.Errorf("%d keys left under the ended lease", n)
		}
		return nil
	})
	w.await("alice", presence.Online, "a1")
	if c := w.record("alice").Conns["a1"]; c.Lease != "E2" {
		t.Errorf("a1 is held under %q, want E2", c.Lease)
	}
}

// TestLeasesEndTogether: two gateways die at once, with many connections:
// all of them end, and nothing else.
func TestLeasesEndTogether(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	w.startReaper(reaper.Config{})
	w.takeLease("gw1", "E1", 2*time.Second)
	w.takeLease("gw2", "F1", 2*time.Second)
	w.takeLease("gw3", "G1", time.Hour)
	const users = 100
	for i := range users {
		u := fmt.Sprintf("u%03d", i)
		w.register("gw1", "E1", u, "a")
		w.register("gw2", "F1", u, "b")
		if i%2 == 0 {
			w.register("gw3", "G1", u, "c")
		}
	}
	for i := range users {
		u := fmt.Sprintf("u%03d", i)
		if i%2 == 0 {
			w.await(u, presence.Online, "c")
		} else {
			w.await(u, presence.Offline)
		}
	}
}

// TestReaperDownWhileALeaseEnds: no reaper runs when a gateway's lease
// ends; one that starts later applies the end from its consumer.
func TestReaperDownWhileALeaseEnds(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	stop := w.startReaper(reaper.Config{}) // makes the durable consumer
	stop()
	w.takeLease("gw1", "E1", time.Second)
	w.register("gw1", "E1", "alice", "a1")
	natstest.CheckFor(t, patience, 20*time.Millisecond, func() error {
		if _, _, err := w.store.Lease(context.Background(), "gw1", "E1"); !errors.Is(err, presence.ErrNotFound) {
			return errors.New("E1 has not ended yet")
		}
		return nil
	})
	w.await("alice", presence.Online, "a1")
	w.startReaper(reaper.Config{})
	w.await("alice", presence.Offline)
}

// TestSweepEndsConnectionsOfLeasesThatAreOver: records name connections of
// a lease that ended when nobody could see it (its marker gone), and keys
// are left under it: the sweep at start repairs both, and leaves the
// connections of live leases.
func TestSweepEndsConnectionsOfLeasesThatAreOver(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	w.takeLease("gw2", "F1", time.Hour)
	w.register("gw1", "gone", "alice", "a1") // a lease that never was
	w.register("gw2", "F1", "alice", "a2")
	w.startReaper(reaper.Config{})
	w.await("alice", presence.Online, "a2")
	if n := w.leaseConns("gw1", "gone"); n != 0 {
		t.Errorf("%d keys left under a lease that is over", n)
	}

	// The same by request, with the reaper running.
	w.register("gw1", "gone2", "bob", "b1")
	reply, err := adminclient.Sweep(context.Background(), w.nc)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Removed != 1 {
		t.Errorf("sweep removed %d connections, want 1", reply.Removed)
	}
	w.await("bob", presence.Offline)
	if n := w.leaseConns("gw1", "gone2"); n != 0 {
		t.Errorf("%d keys left under a lease that is over", n)
	}
}

// TestSweepKeepsConnectionsOfNewLeases: a lease taken while a sweep runs
// is not in its listing; the sweep must not take its connections for
// connections of a lease that is over.
func TestSweepKeepsConnectionsOfNewLeases(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	w.startReaper(reaper.Config{})
	ctx := context.Background()
	removed := 0
	for i := range 30 {
		epoch := fmt.Sprintf("E%d", i)
		w.takeLease("gw1", epoch, time.Hour)
		w.register("gw1", epoch, "alice", fmt.Sprintf("a%d", i))
		reply, err := adminclient.Sweep(ctx, w.nc)
		if err != nil {
			t.Fatal(err)
		}
		removed += reply.Removed
	}
	if removed != 0 {
		t.Errorf("sweeps removed %d live connections", removed)
	}
	if rec := w.record("alice"); len(rec.Conns) != 30 {
		t.Errorf("alice has %d connections, want 30", len(rec.Conns))
	}
}
