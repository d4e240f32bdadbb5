package reaper_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
)

// patience bounds every wait of these tests for something the reaper does.
// It is long, so that the tests pass on a loaded two-core machine; a test
// that passes waits only as long as the reaper takes.
const patience = 30 * time.Second

// world is an embedded NATS server with greendot's buckets, a store that
// plays the gateways' part, and the reapers a test starts.
type world struct {
	t     *testing.T
	srv   *server.Server
	nc    *nats.Conn
	store *presence.Store
	opts  presence.BucketOptions
}

func newWorld(t *testing.T, opts presence.BucketOptions) *world {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	store, err := presence.Open(context.Background(), nc, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, srv: srv, nc: nc, store: store, opts: opts}
}

// startReaper runs a reaper until the returned function (or the end of the
// test) stops it, and waits until it is ready.
func (w *world) startReaper(cfg reaper.Config) (stop func()) {
	w.t.Helper()
	_, stop = w.startReaperOn(natstest.Connect(w.t, w.srv), cfg)
	return stop
}

// startReaperOn is startReaper over the connection nc, and returns the
// reaper too, once it is ready.
func (w *world) startReaperOn(nc *nats.Conn, cfg reaper.Config) (r *reaper.Service, stop func()) {
	w.t.Helper()
	r, stop = w.runReaper(nc, cfg)
	natstest.CheckFor(w.t, patience, 10*time.Millisecond, func() error { return r.Ready(context.Background()) })
	return r, stop
}

// runReaper runs a reaper with cfg over the buckets of w on nc until the
// test ends, or stop, without waiting for it to be ready.
func (w *world) runReaper(nc *nats.Conn, cfg reaper.Config) (r *reaper.Service, stop func()) {
	w.t.Helper()
	cfg.Buckets = w.opts
	r, err := reaper.New(nc, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					w.t.Errorf("reaper: %v", err)
				}
			case <-time.After(patience):
				w.t.Errorf("reaper did not stop within %v", patience)
			}
		})
	}
	w.t.Cleanup(stop)
	return r, stop
}

// live is the key value of a connection in use, inactive an hour from now.
func live() presence.ConnRecord {
	now := time.Now().UnixMilli()
	return presence.ConnRecord{Gateway: "gw1", Since: now, ActiveAt: now, AwayAt: now + time.Hour.Milliseconds()}
}

// connect does what a gateway of the earlier kind did for a new
// connection: it creates the key, of the earlier shape, with a TTL, then
// adds the connection to the user's record. It returns the key's
// revision.
func (w *world) connect(user, conn string, rec presence.ConnRecord, ttl time.Duration) uint64 {
	w.t.Helper()
	rev, err := w.store.CreateConn(context.Background(), user, conn, rec, ttl)
	if err != nil {
		w.t.Fatal(err)
	}
	w.setConn(user, conn, presence.ConnInfo{Gateway: rec.Gateway, Since: rec.Since, Rev: rev})
	return rev
}

func (w *world) setConn(user, conn string, ci presence.ConnInfo) {
	w.t.Helper()
	if _, _, _, err := w.store.UpdateStatus(context.Background(), user, func(r *presence.Record) error {
		r.SetConn(conn, ci)
		return nil
	}); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) purge(user, conn string) {
	w.t.Helper()
	if err := w.store.PurgeConn(context.Background(), user, conn); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) record(user string) presence.Record {
	w.t.Helper()
	rec, _, err := w.store.Status(context.Background(), user)
	if err != nil && !errors.Is(err, presence.ErrNotFound) {
		w.t.Fatal(err)
	}
	return rec
}

// await waits until the user's record has the status and exactly the
// connections given.
func (w *world) await(user string, status presence.Status, conns ...string) {
	w.t.Helper()
	natstest.CheckFor(w.t, patience, 10*time.Millisecond, func() error {
		rec, _, err := w.store.Status(context.Background(), user)
		if err != nil {
			return err
		}
		if rec.Status != status || len(rec.Conns) != len(conns) {
			return fmt.Errorf("%s is %s with connections %v, want %s with %v", user, rec.Status, keys(rec.Conns), status, conns)
		}
		for _, c := range conns {
			if _, ok := rec.Conns[c]; !ok {
				return fmt.Errorf("%s has connections %v, want %v", user, keys(rec.Conns), conns)
			}
		}
		return nil
	})
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestRemovalEndsConnection(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	w.startReaper(reaper.Config{})

	w.connect("alice", "a1", live(), time.Minute)
	w.connect("alice", "a2", live(), time.Minute)
	w.await("alice", presence.Online, "a1", "a2")

	// A purge (a dead socket) removes that connection only.
	w.purge("alice", "a1")
	w.await("alice", presence.Online, "a2")
	if rec := w.record("alice"); rec.Devices != 1 {
		t.Errorf("devices = %d after one of two connections ended, want 1", rec.Devices)
	}

	// The last one ending makes the user offline, with last_seen.
	w.purge("alice", "a2")
	w.await("alice", presence.Offline)
	if rec := w.record("alice"); rec.Public != presence.Offline || rec.LastSeen == 0 || rec.Devices != 0 {
		t.Errorf("record after the last connection ended: %+v", rec)
	}

	// A key that expires (its gateway stopped refreshing it) ends its
	// connection the same way.
	start := time.Now()
	w.connect("bob", "b1", live(), time.Second)
	w.await("bob", presence.Online, "b1")
	w.await("bob", presence.Offline)
	if took := time.Since(start); took < time.Second {
		t.Errorf("bob went offline %v after his key was created with a 1s TTL", took)
	}

	// The end of the offline grace: the gateway rewrote the key as closing
	// with the grace as its TTL.
	rev := w.connect("carol", "c1", live(), time.Minute)
	closing := live()
	closing.Closing, closing.AwayAt = true, 0
	if _, err := w.store.WriteConn(context.Background(), "carol", "c1", closing, time.Second, rev); err != nil {
		t.Fatal(err)
	}
	w.await("carol", presence.Offline)
}

// TestOldMarkerLeavesNewerConnection: a marker whose revision is below the
// revision at which the record says the connection's key was created
// belongs to an earlier life of the key (its gateway created it again after
// it expired), and must not end the connection.
func TestOldMarkerLeavesNewerConnection(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	// Ready comes after the start-up sweep, which would otherwise still
	// run below and take d1 out: its key is gone.
	w.startReaper(reaper.Config{})

	rev := w.connect("dave", "d1", live(), time.Minute)
	// The record says d1's key was created again, at a revision above any
	// marker the purge below can write.
	w.setConn("dave", "d1", presence.ConnInfo{Gateway: "gw1", Rev: rev + 1_000_000})
	w.purge("dave", "d1")

	// A second connection's removal is handled after d1's marker (one
	// user's work runs in order): once d2 is gone, d1's marker was seen.
	w.connect("dave", "d2", live(), time.Minute)
	w.purge("dave", "d2")
	w.await("dave", presence.Online, "d1")
}

// TestSweepRepairsWhatNoReaperSaw: a connection's key expired while no
// reaper ran, and its marker aged out before one came back. Only the sweep
// can tell; it does at start.
func TestSweepRepairsWhatNoReaperSaw(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	// Create the reaper's durable consumer, then stop it.
	stop := w.startReaper(reaper.Config{})
	stop()

	w.connect("judy", "j1", live(), time.Second)
	w.connect("judy", "j2", live(), time.Hour)
	// Wait until j1's key expired and its marker is gone too.
	natstest.CheckFor(t, patience, 50*time.Millisecond, func() error {
		_, rev, err := w.store.Conn(context.Background(), "judy", "j1")
		if !errors.Is(err, presence.ErrNotFound) || rev != 0 {
			return fmt.Errorf("j1: rev %d, %v; want no message at all", rev, err)
		}
		return nil
	})
	w.await("judy", presence.Online, "j1", "j2")

	w.startReaper(reaper.Config{})
	w.await("judy", presence.Online, "j2")

	// The same by request, with a reaper running: a record naming a key
	// that never existed.
	w.setConn("judy", "ghost", presence.ConnInfo{Gateway: "gw1", Rev: 1})
	reply, err := adminclient.Sweep(context.Background(), w.nc)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Removed != 1 {
		t.Errorf("sweep removed %d connections, want 1", reply.Removed)
	}
	w.await("judy", presence.Online, "j2")
}

// TestReadyAfterStartupSweep: a reaper says it is ready only once its
// start-up sweep has finished, so a test or an operator that waits for
// Ready never acts while that sweep still removes connections.
func TestReadyAfterStartupSweep(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	// Records naming connections whose keys never existed: only a sweep
	// removes them. Enough of them that the sweep takes a while.
	const users = 200
	for i := range users {
		w.setConn(fmt.Sprintf("ghost%03d", i), "g1", presence.ConnInfo{Gateway: "gw1", Rev: 1})
	}

	w.startReaper(reaper.Config{}) // returns once Ready returned nil

	left := 0
	for i := range users {
		if rec := w.record(fmt.Sprintf("ghost%03d", i)); len(rec.Conns) != 0 || rec.Status != presence.Offline {
			left++
		}
	}
	if left != 0 {
		t.Errorf("%d of %d records still name a connection whose key never existed once the reaper was ready", left, users)
	}
}

// TestSweepKeepsLiveConnections: the sweep lists connection keys while
// their gateways refresh them. A listing is not a snapshot (a key written
// while it runs can be missed), so a sweep that trusted it would take live
// connections out of their records. It must not.
func TestSweepKeepsLiveConnections(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	w.startReaper(reaper.Config{})
	ctx := context.Background()

	const users = 100
	revs := make([]uint64, users)
	for i := range users {
		revs[i] = w.connect(fmt.Sprintf("u%03d", i), "c", live(), time.Minute)
	}

	// Refresh every key, as gateways do on heartbeats, as fast as possible.
	stopRefresh := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			for i := range users {
				select {
				case <-stopRefresh:
					return
				default:
				}
				rev, err := w.store.WriteConn(ctx, fmt.Sprintf("u%03d", i), "c", live(), time.Minute, revs[i])
				if err != nil {
					t.Errorf("refresh: %v", err)
					return
				}
				revs[i] = rev
			}
		}
	})
	removed := 0
	for range 30 {
		reply, err := adminclient.Sweep(ctx, w.nc)
		if err != nil {
			t.Fatal(err)
		}
		removed += reply.Removed
	}
	close(stopRefresh)
	wg.Wait()
	if removed != 0 {
		t.Errorf("sweeps removed %d live connections", removed)
	}
	for i := range users {
		if rec := w.record(fmt.Sprintf("u%03d", i)); rec.Status != presence.Online || len(rec.Conns) != 1 {
			t.Errorf("u%03d, whose key is live: %s with %d connections", i, rec.Status, len(rec.Conns))
		}
	}
}

// TestTwoReapers: two reapers share the work; each removal is applied once
// in effect, whichever gets it, while both also sweep.
func TestTwoReapers(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	w.startReaper(reaper.Config{SweepInterval: 100 * time.Millisecond})
	w.startReaper(reaper.Config{SweepInterval: 100 * time.Millisecond})
	ctx := context.Background()

	const users = 50
	for i := range users {
		u := fmt.Sprintf("u%02d", i)
		w.connect(u, "keep", live(), time.Minute)
		w.connect(u, "end", live(), time.Minute)
	}
	kv, err := w.store.JetStream().KeyValue(ctx, presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	before := make([]uint64, users)
	for i := range users {
		_, before[i], err = w.store.Status(ctx, fmt.Sprintf("u%02d", i))
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range users {
		w.purge(fmt.Sprintf("u%02d", i), "end")
	}
	for i := range users {
		u := fmt.Sprintf("u%02d", i)
		w.await(u, presence.Online, "keep")
		// Exactly one revision was written after the purge: the removal.
		hist, err := kv.History(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range hist {
			if e.Revision() > before[i] && e.Operation() == jetstream.KeyValuePut {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: %d revisions written for one removal, want 1", u, n)
		}
	}
}

// TestSweepWithoutBuckets: a sweep that cannot read the buckets is refused
// as the admin API says: unavailable (503), not an internal error.
func TestSweepWithoutBuckets(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{})
	w.startReaper(reaper.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := w.store.JetStream().DeleteStream(ctx, presence.StreamName(presence.StatusBucket)); err != nil {
		t.Fatal(err)
	}
	if _, err := adminclient.Sweep(ctx, w.nc); !errors.Is(err, admin.ErrUnavailable) {
		t.Fatalf("sweep without %s: %v, want a 503", presence.StatusBucket, err)
	}
}
