package presence_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/nats-io/nats.go/jetstream"
)

func TestLeaseKeys(t *testing.T) {
	if k := presence.LeaseKey("gw-1", "E1"); k != "gw-1.E1" {
		t.Errorf("LeaseKey = %q", k)
	}
	if gw, e, ok := presence.ParseLeaseKey("gw-1.E1"); !ok || gw != "gw-1" || e != "E1" {
		t.Errorf("ParseLeaseKey = %q %q %v", gw, e, ok)
	}
	for _, bad := range []string{"gw", "gw.", ".e", "g.e.x", "g*.e"} {
		if _, _, ok := presence.ParseLeaseKey(bad); ok {
			t.Errorf("ParseLeaseKey(%q) accepted it", bad)
		}
	}
	key := presence.LeaseConnKey("gw-1", "E1", "alice", "c1")
	if key != "gw-1.E1.alice.c1" {
		t.Errorf("LeaseConnKey = %q", key)
	}
	gw, e, u, c, ok := presence.ParseLeaseConnKey(key)
	if !ok || gw != "gw-1" || e != "E1" || u != "alice" || c != "c1" {
		t.Errorf("ParseLeaseConnKey = %q %q %q %q %v", gw, e, u, c, ok)
	}
	// The two shapes of connection keys never pass for each other.
	if _, _, _, _, ok := presence.ParseLeaseConnKey("alice.c1"); ok {
		t.Error("a key of the earlier shape parsed as one held under a lease")
	}
	if _, _, ok := presence.SplitConnKey(key); ok {
		t.Error("a key held under a lease parsed as one of the earlier shape")
	}
}

func TestChanges(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	online := finished(presence.Record{Conns: map[string]presence.ConnInfo{
		"a": {Gateway: "g1", Lease: "E"}, "b": {Gateway: "g2", Lease: "F"}, "c": {Gateway: "g1", Lease: "E", Closing: true, ClosedAt: 1},
	}}, t0)
	pub, self, gws := presence.Changes("alice", &presence.Record{}, &online, 7)
	if pub == nil || pub.Status != presence.Online || pub.Rev != 7 || pub.At != online.Updated {
		t.Errorf("first record: event %+v, want online at rev 7", pub)
	}
	if self == nil || self.Devices != 2 || self.Rev != 7 {
		t.Errorf("first record: self %+v, want 2 devices at rev 7", self)
	}
	slices.Sort(gws)
	if !slices.Equal(gws, []string{"g1", "g2"}) {
		t.Errorf("self goes to %v, want the gateways of live connections g1 and g2", gws)
	}

	// A second write that changes nothing visible publishes nothing.
	same := online.Clone()
	same.Finish(&online, t0.Add(time.Second))
	if pub, self, _ := presence.Changes("alice", &online, &same, 8); pub != nil || self != nil {
		t.Errorf("an unchanged record: %+v, %+v; want no events", pub, self)
	}

	// Going invisible: others see offline; the user's own devices the truth.
	inv := online.Clone()
	inv.Chosen = presence.Invisible
	inv.Finish(&online, t0.Add(2*time.Second))
	pub, self, _ = presence.Changes("alice", &online, &inv, 9)
	if pub == nil || pub.Status != presence.Offline || self == nil || self.Status != presence.Invisible {
		t.Errorf("invisible: %+v, %+v; want offline to others, invisible to herself", pub, self)
	}

	// A deleted record is offline to everyone.
	if pub, self, _ := presence.Changes("alice", &online, nil, 10); pub == nil || pub.Status != presence.Offline || self != nil {
		t.Errorf("deleted: %+v, %+v", pub, self)
	}
}

// TestMoved: the versions alone tell which events a revision calls for,
// as Changes publishes them.
func TestMoved(t *testing.T) {
	v := func(pub, self uint64) *presence.Versions { return &presence.Versions{PubVer: pub, SelfVer: self} }
	for _, c := range []struct {
		name      string
		prev      *presence.Versions
		next      *presence.Versions
		pub, self bool
	}{
		{"deleted", v(3, 4), nil, true, false},
		{"nothing known before", nil, v(3, 4), true, true},
		{"unchanged", v(3, 4), v(3, 4), false, false},
		{"public view moved", v(3, 4), v(4, 4), true, false},
		{"own state moved", v(3, 4), v(3, 5), false, true},
		{"made again after a deletion", v(3, 4), v(1, 1), true, true},
	} {
		if pub, self := presence.Moved(c.prev, c.next); pub != c.pub || self != c.self {
			t.Errorf("%s: Moved = %v, %v; want %v, %v", c.name, pub, self, c.pub, c.self)
		}
	}
}

func TestLeaseLife(t *testing.T) {
	store, _ := openStore(t, presence.BucketOptions{MarkerTTL: time.Second})
	ctx := context.Background()
	lease := presence.LeaseRecord{Gateway: "gw-1", Epoch: "E1", Started: time.Now().UnixMilli()}
	rev, err := store.CreateLease(ctx, lease, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateLease(ctx, lease, time.Hour); err == nil {
		t.Error("a lease was created twice")
	}
	got, gotRev, err := store.Lease(ctx, "gw-1", "E1")
	if err != nil || got != lease || gotRev != rev {
		t.Errorf("Lease = %+v at %d, %v; want %+v at %d", got, gotRev, err, lease, rev)
	}
	leases, err := store.Leases(ctx)
	if err != nil || len(leases) != 1 || leases["gw-1.E1"] != lease {
		t.Errorf("Leases = %v, %v", leases, err)
	}

	// Connections under the lease, and one under another.
	for _, c := range []presence.LeaseConn{{"gw-1", "E1", "alice", "a1"}, {"gw-1", "E1", "bob", "b1"}, {"gw-1", "E2", "alice", "a2"}} {
		if _, err := store.CreateLeaseConn(ctx, c, presence.ConnRecord{Gateway: c.Gateway, Lease: c.Epoch}); err != nil {
			t.Fatal(err)
		}
	}
	conns, err := store.LeaseConns(ctx, "gw-1", "E1")
	if err != nil || len(conns) != 2 {
		t.Fatalf("LeaseConns(E1) = %v, %v; want a1 and b1", conns, err)
	}
	mine, err := store.UserLeaseConns(ctx, "alice")
	if err != nil || len(mine) != 2 {
		t.Errorf("UserLeaseConns(alice) = %v, %v; want a1 and a2", mine, err)
	}
	if err := store.RemoveLeaseConn(ctx, presence.LeaseConn{"gw-1", "E1", "bob", "b1"}); err != nil {
		t.Fatal(err)
	}
	if err := store.RemoveLeaseConns(ctx, "gw-1", "E1"); err != nil {
		t.Fatal(err)
	}
	if conns, _ := store.LeaseConns(ctx, "gw-1", "E1"); len(conns) != 0 {
		t.Errorf("after removing E1's connections: %v", conns)
	}
	if conns, _ := store.LeaseConns(ctx, "gw-1", "E2"); len(conns) != 1 {
		t.Errorf("removing E1's connections touched E2's: %v", conns)
	}

	if err := store.DeleteLease(ctx, "gw-1", "E1", rev+1); err == nil {
		t.Error("a lease was deleted at a revision not its newest")
	}
	if err := store.DeleteLease(ctx, "gw-1", "E1", rev); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Lease(ctx, "gw-1", "E1"); !errors.Is(err, presence.ErrNotFound) {
		t.Errorf("Lease after delete: %v, want ErrNotFound", err)
	}
	// The delete marker expires as an expired lease's does: markers of
	// leases that come and go do not pile up.
	stream, err := store.JetStream().Stream(ctx, "KV_"+presence.LeasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	marker, err := stream.GetLastMsgForSubject(ctx, presence.KeySubject(presence.LeasesBucket, "gw-1.E1"))
	if err != nil {
		t.Fatal(err)
	}
	if op := presence.EntryOp(marker.Header); op != jetstream.KeyValueDelete {
		t.Errorf("the lease's last message is a %v, want a delete", op)
	}
	if ttl, err := time.ParseDuration(marker.Header.Get(jetstream.MsgTTLHeader)); err != nil || ttl != presence.LeaseMarkerTTL {
		t.Errorf("the delete marker's TTL is %q, want %v", marker.Header.Get(jetstream.MsgTTLHeader), presence.LeaseMarkerTTL)
	}

	// A lease whose gateway stops refreshing it expires.
	short := presence.LeaseRecord{Gateway: "gw-2", Epoch: "E1"}
	if _, err := store.CreateLease(ctx, short, time.Second); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if _, _, err := store.Lease(ctx, "gw-2", "E1"); !errors.Is(err, presence.ErrNotFound) {
			return errors.New("the lease is still there")
		}
		return nil
	})
}

func TestWriteStatusFromCache(t *testing.T) {
	store, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()
	var cache presence.Cached
	add := func(id string) func(*presence.Record) error {
		return func(r *presence.Record) error {
			r.SetConn(id, presence.ConnInfo{Gateway: "g1", Lease: "E"})
			return nil
		}
	}
	w, err := store.WriteStatus(ctx, "alice", &cache, add("a"))
	if err != nil || !w.Written || w.Prev.Updated != 0 || w.Next.Status != presence.Online {
		t.Fatalf("first write: %+v, %v", w, err)
	}
	if !cache.Valid || cache.Rev != w.Rev {
		t.Fatalf("cache after a write: %+v, want rev %d", cache, w.Rev)
	}
	// Someone else writes: the cached write fails its compare-and-set,
	// reads again, and keeps what the other wrote.
	if _, _, _, err := store.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
		r.Chosen = presence.Busy
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	w, err = store.WriteStatus(ctx, "alice", &cache, add("b"))
	if err != nil || !w.Written || w.Next.Status != presence.Busy || len(w.Next.Conns) != 2 {
		t.Fatalf("write over another's: %+v, %v", w, err)
	}
	// Nothing to change: not written, and the cache still right.
	w, err = store.WriteStatus(ctx, "alice", &cache, func(*presence.Record) error { return presence.ErrNoChange })
	if err != nil || w.Written || w.Rev != cache.Rev {
		t.Fatalf("no change: %+v, %v", w, err)
	}
	// A removal with the time the connection was last seen dates
	// last_seen when it was the last.
	seen := time.Now().Add(-time.Minute).Truncate(time.Second)
	w, err = store.WriteStatus(ctx, "alice", &cache, func(r *presence.Record) error {
		r.RemoveConn("a", seen.UnixMilli())
		r.RemoveConn("b", seen.Add(-time.Second).UnixMilli())
		return nil
	})
	if err != nil || w.Next.Status != presence.Offline {
		t.Fatalf("remove both: %+v, %v", w, err)
	}
	if w.Next.LastSeen != seen.Unix() {
		t.Errorf("last_seen %d, want %d (the later of the two)", w.Next.LastSeen, seen.Unix())
	}
}

// TestWriteStatusKeepsItsCopy: a writer that writes a user again from
// its copy keeps the copy decoded, and that copy is always what the
// bucket holds: the record, as a read decodes it, and its unfed count,
// through additions, removals (whose last-seen times are not stored),
// chosen statuses, more writes than the bucket keeps revisions of, and
// another writer's write.
func TestWriteStatusKeepsItsCopy(t *testing.T) {
	store, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()
	kv := bucketKV(t, store, presence.StatusBucket)
	var cache presence.Cached
	check := func(step string, decoded bool) {
		t.Helper()
		got, unfed, isDecoded, err := presence.CachedCopy(&cache)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		want, rev, err := store.Status(ctx, "alice")
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		e, err := kv.Get(ctx, presence.StatusKey("alice"))
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		wantUnfed, err := presence.UnfedOf(e.Value())
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if len(got.Conns) == 0 {
			got.Conns = nil // an emptied map; a decoded record has none
		}
		if !reflect.DeepEqual(got, want) || unfed != wantUnfed || cache.Rev != rev || !cache.Valid {
			t.Errorf("%s: copy %+v (unfed %d) at %d, valid %v; the bucket has %+v (unfed %d) at %d",
				step, got, unfed, cache.Rev, cache.Valid, want, wantUnfed, rev)
		}
		if isDecoded != decoded {
			t.Errorf("%s: copy kept decoded %v, want %v", step, isDecoded, decoded)
		}
	}
	write := func(step string, mutate func(*presence.Record)) {
		t.Helper()
		w, err := store.WriteStatus(ctx, "alice", &cache, func(r *presence.Record) error {
			mutate(r)
			return nil
		})
		if err != nil || !w.Written {
			t.Fatalf("%s: %+v, %v", step, w, err)
		}
	}
	seen := time.Now().Add(-time.Minute).UnixMilli()

	write("add a", func(r *presence.Record) { r.SetConn("a", presence.ConnInfo{Gateway: "g1", Lease: "E", Since: 1}) })
	check("add a", false) // a first write, from a read: kept as stored
	write("add b", func(r *presence.Record) { r.SetConn("b", presence.ConnInfo{Gateway: "g1", Lease: "E", Since: 2}) })
	check("add b", true)
	write("busy", func(r *presence.Record) { r.Chosen = presence.Busy })
	check("busy", true)
	write("remove a", func(r *presence.Record) { r.RemoveConn("a", seen) })
	check("remove a", true)
	write("remove b", func(r *presence.Record) { r.RemoveConn("b", seen) })
	check("remove b", true)
	for i := range 2*presence.StatusHistory + 1 {
		step := fmt.Sprintf("flip %d", i)
		write(step, func(r *presence.Record) {
			r.Chosen = map[bool]presence.Status{true: presence.Away, false: presence.Busy}[r.Chosen == presence.Busy]
		})
		check(step, true)
	}
	// Another writer: the decoded copy's write fails its compare-and-set,
	// reads again, and keeps what the other wrote.
	if _, _, _, err := store.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
		r.SetConn("x", presence.ConnInfo{Gateway: "g2", Lease: "F", Since: 3})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	write("add c over another's", func(r *presence.Record) { r.SetConn("c", presence.ConnInfo{Gateway: "g1", Lease: "E", Since: 4}) })
	check("add c over another's", false)
	if got, _, _, _ := presence.CachedCopy(&cache); len(got.Conns) != 2 {
		t.Errorf("after a write over another's: %v, want x and c", got.Conns)
	}
	write("idle c", func(r *presence.Record) {
		c := r.Conns["c"]
		c.Idle = true
		r.SetConn("c", c)
	})
	check("idle c", true)
}

// TestWriteStatusCacheNeverSaysNoChange: a writer whose cached copy says
// the change is already made must not believe it: another writer may have
// changed the record since (seen as a set_status lost between gateways).
func TestWriteStatusCacheNeverSaysNoChange(t *testing.T) {
	store, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()
	choose := func(st presence.Status) func(*presence.Record) error {
		return func(r *presence.Record) error {
			if r.ChosenStatus() == st {
				return presence.ErrNoChange
			}
			r.Chosen = st
			return nil
		}
	}
	var a, b presence.Cached // two gateways' writers
	if _, err := store.WriteStatus(ctx, "alice", &a, choose(presence.Busy)); err != nil {
		t.Fatal(err)
	}
	if _, err := store.WriteStatus(ctx, "alice", &b, choose(presence.Online)); err != nil {
		t.Fatal(err)
	}
	// a's copy still says busy; the record says online.
	w, err := store.WriteStatus(ctx, "alice", &a, choose(presence.Busy))
	if err != nil || !w.Written {
		t.Fatalf("busy again from a stale copy: %+v, %v; want it written", w, err)
	}
	if rec, _, _ := store.Status(ctx, "alice"); rec.ChosenStatus() != presence.Busy {
		t.Errorf("record says %s, want busy", rec.ChosenStatus())
	}
}
