package reaper_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/internal/metricstest"
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

// endLease ends a lease now, as its gateway does when it stops.
func (w *world) endLease(gw, epoch string, rev uint64) {
	w.t.Helper()
	if err := w.store.DeleteLease(context.Background(), gw, epoch, rev); err != nil {
		w.t.Fatal(err)
	}
}

// TestLeaseEndPastAnUndecodableRecord: one user's record under a lease
// that ends is not greendot's (a `nats kv put` by hand). It is left as it
// is, counted, and the end of the lease is applied all the same: the other
// users go offline, and the lease's connection keys and room keys go.
func TestLeaseEndPastAnUndecodableRecord(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	r, _ := w.startReaperOn(natstest.Connect(t, w.srv), reaper.Config{})
	ctx := context.Background()
	rev := w.takeLease("gw1", "E1", time.Hour)
	w.register("gw1", "E1", "alice", "a1")
	w.register("gw1", "E1", "bob", "b1")
	w.joinRoom("lobby", "gw1", "E1", "bob", "b1")
	kv, err := w.store.JetStream().KeyValue(ctx, presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "bob", []byte("not json")); err != nil {
		t.Fatal(err)
	}

	w.endLease("gw1", "E1", rev)
	w.await("alice", presence.Offline)
	natstest.CheckFor(t, patience, 20*time.Millisecond, func() error {
		if n, m := w.leaseConns("gw1", "E1"), len(w.roomConns("lobby")); n != 0 || m != 0 {
			return fmt.Errorf("%d connection keys and %d room keys left under the ended lease", n, m)
		}
		return nil
	})
	if got, _ := metricstest.Value(r.Registry(), "greendot_reaper_reconciles_total", "kind", "lease", "result", "undecodable"); got < 1 {
		t.Errorf("undecodable reconciles = %v, want at least 1", got)
	}
	if e, err := kv.Get(ctx, "bob"); err != nil || string(e.Value()) != "not json" {
		t.Errorf("bob's record was changed: %v", err)
	}
}

// TestLeaseEndsAfterTheConsumerIsDeleted: the reaper's durable consumer
// is deleted while it runs (`nats consumer rm KV_presence_leases
// reaper`): the reaper creates it again, and applies the ends of leases
// as before.
func TestLeaseEndsAfterTheConsumerIsDeleted(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	r, _ := w.startReaperOn(natstest.Connect(t, w.srv), reaper.Config{})
	ctx := context.Background()
	js := w.store.JetStream()
	stream := presence.StreamName(presence.LeasesBucket)
	if err := js.DeleteConsumer(ctx, stream, presence.ReaperConsumer); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, patience, 10*time.Millisecond, func() error {
		_, err := js.Consumer(ctx, stream, presence.ReaperConsumer)
		return err
	})
	natstest.CheckFor(t, patience, 10*time.Millisecond, func() error { return r.Ready(ctx) })

	rev := w.takeLease("gw1", "E1", time.Hour)
	w.register("gw1", "E1", "alice", "a1")
	w.endLease("gw1", "E1", rev)
	w.await("alice", presence.Offline)
}

// TestSweepHeldAfterReconnect: the reaper's NATS connection came back a
// moment ago, and a lease ended while it was away: its gateway, which
// lost NATS too, may be registering its connections again under a new
// lease. The lease's end waits for the rejoin hold, and so do the sweeps,
// periodic and on request: the lease's connections stay in their records,
// and their keys stay.
func TestSweepHeldAfterReconnect(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	nc := natstest.Connect(t, w.srv)
	r, _ := w.startReaperOn(nc, reaper.Config{SweepInterval: 100 * time.Millisecond, RejoinHold: time.Hour})
	ctx := context.Background()
	rev := w.takeLease("gw1", "E1", time.Hour)
	w.register("gw1", "E1", "alice", "a1")

	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, patience, 10*time.Millisecond, func() error {
		if nc.Stats().Reconnects == 0 || !nc.IsConnected() {
			return errors.New("the reaper's connection has not come back")
		}
		return nil
	})
	w.endLease("gw1", "E1", rev)

	reply, err := adminclient.Sweep(ctx, w.nc)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Removed != 0 {
		t.Errorf("a sweep within the rejoin hold removed %d connections", reply.Removed)
	}
	// Two periodic sweeps more, the second begun after the lease ended.
	sweeps := func() float64 {
		v, _ := metricstest.Value(r.Registry(), "greendot_reaper_sweeps_total", "result", "ok")
		return v
	}
	after := sweeps() + 2
	natstest.CheckFor(t, patience, 10*time.Millisecond, func() error {
		if got := sweeps(); got < after {
			return fmt.Errorf("%v sweeps, waiting for %v", got, after)
		}
		return nil
	})
	w.await("alice", presence.Online, "a1")
	if n := w.leaseConns("gw1", "E1"); n != 1 {
		t.Errorf("%d connection keys under the ended lease within the rejoin hold, want 1", n)
	}
}
