package presence_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// openStore runs an embedded server and opens the buckets on it.
func openStore(t *testing.T, opts presence.BucketOptions) (*presence.Store, *nats.Conn) {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	st, err := presence.Open(context.Background(), nc, opts)
	if err != nil {
		t.Fatal(err)
	}
	return st, nc
}

// bucketKV returns one of st's buckets.
func bucketKV(t *testing.T, st *presence.Store, bucket string) jetstream.KeyValue {
	t.Helper()
	kv, err := st.JetStream().KeyValue(context.Background(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// TestUpdateStatusConcurrent: writers racing on one record by
// compare-and-set lose no update.
func TestUpdateStatusConcurrent(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()
	const writers, each = 8, 25
	var conflicts sync.Mutex
	lost := 0
	st.OnConflict(func() {
		conflicts.Lock()
		lost++
		conflicts.Unlock()
	})

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				_, _, written, err := st.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
					r.SetConn(id, presence.ConnInfo{Gateway: "g"})
					return nil
				})
				if err != nil || !written {
					t.Errorf("add %s: written %v, %v", id, written, err)
					return
				}
			}
		})
	}
	wg.Wait()

	rec, rev, err := st.Status(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Conns) != writers*each || rec.Devices != writers*each {
		t.Errorf("%d connections, %d devices after %d adds", len(rec.Conns), rec.Devices, writers*each)
	}
	// Every add changed the device count, so each bumped SelfVer once.
	if rec.SelfVer != writers*each {
		t.Errorf("SelfVer = %d, want %d: an update was lost or applied twice", rec.SelfVer, writers*each)
	}
	if rev == 0 {
		t.Error("no revision")
	}
	t.Logf("%d writes, %d compare-and-set conflicts", writers*each, lost)
}

func TestUpdateStatusNoChange(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()

	// A user with no record: the mutation sees a zero record and the
	// write creates it.
	rec, rev, written, err := st.UpdateStatus(ctx, "bob", func(r *presence.Record) error {
		if r.Status != "" || len(r.Conns) != 0 {
			t.Errorf("a missing record reads as %+v", r)
		}
		r.Chosen = presence.Busy
		return nil
	})
	if err != nil || !written || rev == 0 || rec.Chosen != presence.Busy {
		t.Fatalf("create: %+v, rev %d, written %v, %v", rec, rev, written, err)
	}

	// ErrNoChange writes nothing and returns the current record.
	got, gotRev, written, err := st.UpdateStatus(ctx, "bob", func(r *presence.Record) error {
		return presence.ErrNoChange
	})
	if err != nil || written || gotRev != rev || got.Chosen != presence.Busy {
		t.Errorf("no change: %+v, rev %d (want %d), written %v, %v", got, gotRev, rev, written, err)
	}
	if _, now, _ := st.Status(ctx, "bob"); now != rev {
		t.Errorf("revision moved from %d to %d without a write", rev, now)
	}

	// Any other error comes back as it is, and nothing is written.
	boom := errors.New("boom")
	if _, _, written, err := st.UpdateStatus(ctx, "bob", func(r *presence.Record) error { return boom }); !errors.Is(err, boom) || written {
		t.Errorf("failing mutation: written %v, %v", written, err)
	}
	if _, now, _ := st.Status(ctx, "bob"); now != rev {
		t.Errorf("revision moved from %d to %d after a failed mutation", rev, now)
	}
}

func TestStatusAfterDelete(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()

	if _, rev, err := st.Status(ctx, "carol"); !errors.Is(err, presence.ErrNotFound) || rev != 0 {
		t.Errorf("never written: rev %d, %v; want ErrNotFound at 0", rev, err)
	}
	_, rev, _, err := st.UpdateStatus(ctx, "carol", func(r *presence.Record) error {
		r.SetConn("c1", presence.ConnInfo{Gateway: "g"})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// An operator deletes the record: it reads as missing, at the marker's
	// revision, and the next update creates it over the marker.
	if err := st.DeleteStatus(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	_, markerRev, err := st.Status(ctx, "carol")
	if !errors.Is(err, presence.ErrNotFound) || markerRev <= rev {
		t.Errorf("deleted: rev %d, %v; want ErrNotFound above %d", markerRev, err, rev)
	}
	rec, newRev, written, err := st.UpdateStatus(ctx, "carol", func(r *presence.Record) error {
		if len(r.Conns) != 0 {
			t.Errorf("a deleted record reads as %+v", r)
		}
		r.SetConn("c2", presence.ConnInfo{Gateway: "g"})
		return nil
	})
	if err != nil || !written || newRev <= markerRev || rec.Status != presence.Online {
		t.Errorf("after delete: %+v, rev %d, written %v, %v", rec, newRev, written, err)
	}
}

// TestConnLifecycle re-checks, through the Store, what the gateway and the
// reaper rely on JetStream KV to do with connection keys
// (docs/architecture.md, "State").
func TestConnLifecycle(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{MarkerTTL: time.Second})
	ctx := context.Background()
	kv := bucketKV(t, st, presence.ConnsBucket)

	w, err := kv.Watch(ctx, presence.ConnKeyFilter("dave"), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	next := func() jetstream.KeyValueEntry {
		t.Helper()
		select {
		case e := <-w.Updates():
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("no entry from the watcher within 10s")
			return nil
		}
	}

	rec := presence.ConnRecord{Gateway: "g", Since: 1, ActiveAt: 1}
	created := time.Now()
	rev, err := st.CreateConn(ctx, "dave", "d1", rec, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Operation() != jetstream.KeyValuePut || e.Revision() != rev {
		t.Fatalf("watcher: %v at %d, want the put at %d", e.Operation(), e.Revision(), rev)
	}
	// Create fails while the key lives.
	if _, err := st.CreateConn(ctx, "dave", "d1", rec, time.Second); err == nil {
		t.Error("created a key that exists")
	}

	// The key expires by itself and watchers see a purge marker.
	e := next()
	expired := time.Now()
	if e.Operation() != jetstream.KeyValuePurge || e.Revision() <= rev {
		t.Fatalf("watcher: %v at %d, want an expiry marker after %d", e.Operation(), e.Revision(), rev)
	}
	if took := expired.Sub(created); took < time.Second || took > 3*time.Second {
		t.Errorf("the key expired %v after it was created with a 1s TTL", took)
	}
	_, markerRev, err := st.Conn(ctx, "dave", "d1")
	if !errors.Is(err, presence.ErrNotFound) || markerRev != e.Revision() {
		t.Errorf("expired key: rev %d, %v; want ErrNotFound at the marker's %d", markerRev, err, e.Revision())
	}
	// A watcher started now still sees the marker, until the marker TTL.
	late, err := kv.Watch(ctx, presence.ConnKeyFilter("dave"))
	if err != nil {
		t.Fatal(err)
	}
	first := <-late.Updates()
	_ = late.Stop()
	if first == nil || first.Operation() != jetstream.KeyValuePurge {
		t.Errorf("a later watcher's first entry: %v, want the marker", first)
	}

	// A key is created again over its expiry marker.
	rev2, err := st.CreateConn(ctx, "dave", "d1", rec, time.Minute)
	if err != nil {
		t.Fatalf("create over the marker: %v", err)
	}
	if rev2 <= markerRev {
		t.Errorf("recreated at %d, not after the marker at %d", rev2, markerRev)
	}
	_ = next()

	// Compare-and-set writes: a wrong revision is refused, and says so.
	if _, err := st.WriteConn(ctx, "dave", "d1", rec, time.Minute, rev2+10); !presence.IsWrongLastSequence(err) {
		t.Errorf("write at a wrong revision: %v, want a wrong-last-sequence error", err)
	}
	if _, err := st.WriteConn(ctx, "dave", "d1", rec, time.Minute, rev); !presence.IsWrongLastSequence(err) {
		t.Errorf("write at an old revision: %v, want a wrong-last-sequence error", err)
	}

	// A write with a TTL replaces the key's TTL. Refreshed with
	// 2s, the key outlives the 1s it was first given.
	rev3, err := st.CreateConn(ctx, "dave", "d2", rec, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = next()
	refreshed := time.Now()
	rev4, err := st.WriteConn(ctx, "dave", "d2", rec, 2*time.Second, rev3)
	if err != nil || rev4 <= rev3 {
		t.Fatalf("refresh: rev %d, %v", rev4, err)
	}
	if e := next(); e.Operation() != jetstream.KeyValuePut || e.Revision() != rev4 {
		t.Fatalf("watcher: %v at %d, want the refresh at %d", e.Operation(), e.Revision(), rev4)
	}
	if e := next(); e.Operation() != jetstream.KeyValuePurge || e.Key() != presence.ConnKey("dave", "d2") {
		t.Fatalf("watcher: %v of %s, want d2's expiry", e.Operation(), e.Key())
	}
	if took := time.Since(refreshed); took < 2*time.Second {
		t.Errorf("the refreshed key expired %v after a write with a 2s TTL", took)
	}
	// A write to a key that is gone is refused: the gateway must create
	// it again.
	if _, err := st.WriteConn(ctx, "dave", "d2", rec, time.Minute, rev4); !presence.IsWrongLastSequence(err) {
		t.Errorf("write to an expired key: %v, want a wrong-last-sequence error", err)
	}

	// A purge removes a key at once; its marker stays for the marker TTL,
	// then vanishes.
	if _, err := st.CreateConn(ctx, "dave", "d3", rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	_ = next()
	if err := st.PurgeConn(ctx, "dave", "d3"); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Operation() != jetstream.KeyValuePurge || e.Key() != presence.ConnKey("dave", "d3") {
		t.Fatalf("watcher: %v of %s, want d3's purge", e.Operation(), e.Key())
	}
	natstest.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		_, rev, err := st.Conn(ctx, "dave", "d3")
		if !errors.Is(err, presence.ErrNotFound) || rev != 0 {
			return fmt.Errorf("d3: rev %d, %v; want nothing left", rev, err)
		}
		return nil
	})

	if presence.IsWrongLastSequence(nil) || presence.IsWrongLastSequence(errors.New("x")) {
		t.Error("IsWrongLastSequence is true for an unrelated error")
	}
}

// TestConnReadDuringRefresh: a key refreshed again and again is always
// found by Conn, which reads the newest message from the stream leader. The
// sweep relies on it to confirm that a connection is gone.
func TestConnReadDuringRefresh(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()
	const n = 20
	revs := make([]uint64, n)
	for i := range n {
		var err error
		if revs[i], err = st.CreateConn(ctx, "erin", fmt.Sprintf("e%d", i), presence.ConnRecord{Gateway: "g"}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			for i := range n {
				select {
				case <-stop:
					return
				default:
				}
				rev, err := st.WriteConn(ctx, "erin", fmt.Sprintf("e%d", i), presence.ConnRecord{Gateway: "g"}, time.Minute, revs[i])
				if err != nil {
					t.Errorf("refresh: %v", err)
					return
				}
				revs[i] = rev
			}
		}
	})
	for round := range 100 {
		for i := range n {
			if _, _, err := st.Conn(ctx, "erin", fmt.Sprintf("e%d", i)); err != nil {
				t.Errorf("round %d: e%d: %v", round, i, err)
			}
		}
	}
	close(stop)
	wg.Wait()
}

func TestScans(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{MarkerTTL: time.Second})
	ctx := context.Background()

	for _, u := range []string{"a", "b", "c"} {
		if _, _, _, err := st.UpdateStatus(ctx, u, func(r *presence.Record) error {
			r.Chosen = presence.Busy
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	var users []string
	if err := st.ScanStatus(ctx, func(userID string, rec presence.Record, rev uint64) error {
		if rec.Chosen != presence.Busy || rev == 0 {
			t.Errorf("%s: %+v at %d", userID, rec, rev)
		}
		users = append(users, userID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(users)
	if !slices.Equal(users, []string{"a", "b", "c"}) {
		t.Errorf("scanned %v", users)
	}
	stopErr := errors.New("enough")
	n := 0
	if err := st.ScanStatus(ctx, func(string, presence.Record, uint64) error { n++; return stopErr }); !errors.Is(err, stopErr) || n != 1 {
		t.Errorf("stopping early: %d calls, %v", n, err)
	}
	// A value that is not a record is skipped by ScanStatus, and named by
	// ScanStatusAll.
	status, err := st.JetStream().KeyValue(ctx, presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := status.Put(ctx, "junk", []byte("not JSON")); err != nil {
		t.Fatal(err)
	}
	users, n = nil, 0
	var skipped []string
	if err := st.ScanStatusAll(ctx, func(userID string, _ presence.Record, _ uint64) error {
		users = append(users, userID)
		return nil
	}, func(key string, err error) {
		skipped = append(skipped, key)
		if err == nil {
			t.Errorf("%s skipped with no error", key)
		}
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(users)
	if !slices.Equal(users, []string{"a", "b", "c"}) || !slices.Equal(skipped, []string{"junk"}) {
		t.Errorf("ScanStatusAll: records of %v, skipped %v; want a, b, c and junk", users, skipped)
	}
	if err := st.ScanStatus(ctx, func(userID string, _ presence.Record, _ uint64) error {
		n++
		return nil
	}); err != nil || n != 3 {
		t.Errorf("ScanStatus with junk: %d records, %v; want 3", n, err)
	}
	if err := status.Delete(ctx, "junk"); err != nil {
		t.Fatal(err)
	}

	for _, k := range [][2]string{{"a", "1"}, {"a", "2"}, {"b", "1"}, {"b", "2"}} {
		if _, err := st.CreateConn(ctx, k[0], k[1], presence.ConnRecord{Gateway: "g", Device: k[1]}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.PurgeConn(ctx, "b", "2"); err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := st.ScanConns(ctx, func(userID, connID string, rec presence.ConnRecord, rev uint64) error {
		if rec.Device != connID || rev == 0 {
			t.Errorf("%s.%s: %+v at %d", userID, connID, rec, rev)
		}
		keys = append(keys, presence.ConnKey(userID, connID))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"a.1", "a.2", "b.1"}) {
		t.Errorf("scanned keys %v, want the live ones", keys)
	}
	conns, err := st.UserConns(ctx, "a")
	if err != nil || len(conns) != 2 || conns["1"].Device != "1" {
		t.Errorf("UserConns(a) = %v, %v", conns, err)
	}
	if conns, err := st.UserConns(ctx, "nobody"); err != nil || len(conns) != 0 {
		t.Errorf("UserConns(nobody) = %v, %v", conns, err)
	}
}

// TestFollowingInBatches: a user's follows are read in one batch, which
// leaves out unfollowed users and stops at a limit; past what NATS gives
// in one batch (1,024 keys) they are listed instead, all of them.
func TestFollowingInBatches(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()
	if got, all, ok, err := presence.FollowingBatch(st, ctx, "nobody", 0); err != nil || !ok || !all || len(got) != 0 {
		t.Errorf("batch of nobody's follows = %v, %v, %v, %v; want none, answered", got, all, ok, err)
	}
	for i := range 6 {
		if err := st.Follow(ctx, "a", fmt.Sprintf("u%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range []string{"u1", "u4"} {
		if err := st.Unfollow(ctx, "a", u); err != nil {
			t.Fatal(err)
		}
	}
	got, all, ok, err := presence.FollowingBatch(st, ctx, "a", 0)
	slices.Sort(got)
	if want := []string{"u0", "u2", "u3", "u5"}; err != nil || !ok || !all || !slices.Equal(got, want) {
		t.Errorf("batch of a's follows = %v, %v, %v, %v; want %v, all, answered", got, all, ok, err, want)
	}
	if got, all, ok, err := presence.FollowingBatch(st, ctx, "a", 3); err != nil || !ok || all || len(got) != 3 {
		t.Errorf("batch of 3 of a's follows = %v, %v, %v, %v; want 3 of 4, answered", got, all, ok, err)
	}

	const many = 1100
	for i := range many {
		if err := st.Follow(ctx, "big", fmt.Sprintf("u%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, ok, err := presence.FollowingBatch(st, ctx, "big", 0); ok || err != nil {
		t.Errorf("a batch of %d keys: answered %v, %v; want no answer, to list them", many, ok, err)
	}
	if got, all, err := st.FollowingAtMost(ctx, "big", 0); err != nil || !all || len(got) != many {
		t.Errorf("FollowingAtMost(big) = %d users, %v, %v; want %d, all", len(got), all, err, many)
	}
	if got, all, err := st.FollowingAtMost(ctx, "big", 10); err != nil || all || len(got) != 10 {
		t.Errorf("FollowingAtMost(big, 10) = %d users, %v, %v; want 10, not all", len(got), all, err)
	}

	// A batch cut short by its context is no list: its messages end
	// quietly as if they were all.
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if got, _, err := st.FollowingAtMost(expired, "a", 0); err == nil {
		t.Errorf("FollowingAtMost with an expired context = %v, no error", got)
	}

	// A bucket that answers no direct gets has its keys listed.
	js := st.JetStream()
	stream, err := js.Stream(ctx, presence.StreamName(presence.GraphBucket))
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := presence.FollowingBatch(st, ctx, "a", 0); ok || err != nil {
		t.Errorf("a batch without direct gets: answered %v, %v; want no answer, to list them", ok, err)
	}
	got, all, err = st.FollowingAtMost(ctx, "a", 0)
	slices.Sort(got)
	if want := []string{"u0", "u2", "u3", "u5"}; err != nil || !all || !slices.Equal(got, want) {
		t.Errorf("FollowingAtMost(a) without direct gets = %v, %v, %v; want %v, all", got, all, err, want)
	}
}

// TestFollowingWithoutBatchPermission: a user that may not ask for a
// batch of the graph (permissions written before it) gets no answer, only
// a violation in the server's log; its follows are listed instead.
func TestFollowingWithoutBatchPermission(t *testing.T) {
	srv := natstest.RunServerWithOptions(t, &server.Options{Users: []*server.User{{
		Username: "u", Password: "p",
		Permissions: &server.Permissions{Publish: &server.SubjectPermission{
			Allow: []string{">"},
			Deny:  []string{"$JS.API.DIRECT.GET." + presence.StreamName(presence.GraphBucket)},
		}},
	}}})
	nc := natstest.Connect(t, srv, nats.UserInfo("u", "p"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	ctx := context.Background()
	st, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"b", "c"} {
		if err := st.Follow(ctx, "a", u); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := st.Follows(ctx, "a", "b"); !ok || err != nil {
		t.Fatalf("a follows b: %v, %v (a read of one key is allowed)", ok, err)
	}
	if _, _, ok, err := presence.FollowingBatch(st, ctx, "a", 0); ok || err != nil {
		t.Errorf("a batch refused: answered %v, %v; want no answer, to list them", ok, err)
	}
	got, all, err := st.FollowingAtMost(ctx, "a", 0)
	slices.Sort(got)
	if err != nil || !all || !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("FollowingAtMost(a) = %v, %v, %v; want [b c], all", got, all, err)
	}
}

func TestGraph(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()

	for _, e := range [][2]string{{"a", "b"}, {"a", "c"}, {"b", "a"}, {"c", "b"}} {
		if err := st.Follow(ctx, e[0], e[1]); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := st.Follows(ctx, "a", "b"); !ok || err != nil {
		t.Errorf("a follows b: %v, %v", ok, err)
	}
	if ok, err := st.Follows(ctx, "b", "c"); ok || err != nil {
		t.Errorf("b follows c: %v, %v", ok, err)
	}
	following, err := st.Following(ctx, "a")
	slices.Sort(following)
	if err != nil || !slices.Equal(following, []string{"b", "c"}) {
		t.Errorf("a follows %v, %v", following, err)
	}
	for _, tc := range []struct {
		max  int
		n    int
		want bool
	}{{0, 2, true}, {2, 2, true}, {3, 2, true}, {1, 1, false}} {
		got, all, err := st.FollowingAtMost(ctx, "a", tc.max)
		if err != nil || len(got) != tc.n || all != tc.want || !slices.ContainsFunc(got, func(u string) bool { return u == "b" || u == "c" }) {
			t.Errorf("FollowingAtMost(a, %d) = %v, %v, %v; want %d of b and c, %v", tc.max, got, all, err, tc.n, tc.want)
		}
	}
	followers, err := st.Followers(ctx, "b")
	slices.Sort(followers)
	if err != nil || !slices.Equal(followers, []string{"a", "c"}) {
		t.Errorf("b's followers %v, %v", followers, err)
	}
	if err := st.Unfollow(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := st.Follows(ctx, "a", "b"); ok {
		t.Error("a still follows b after unfollowing")
	}
	if err := st.Follow(ctx, "a", "b.c"); !errors.Is(err, presence.ErrInvalidUserID) {
		t.Errorf("follow an invalid id: %v", err)
	}
	if err := st.Unfollow(ctx, "", "b"); !errors.Is(err, presence.ErrInvalidUserID) {
		t.Errorf("unfollow an invalid id: %v", err)
	}

	if s, err := st.Settings(ctx, "a"); err != nil || s.LastSeenVisibility() != presence.Contacts {
		t.Errorf("default settings: %+v, %v", s, err)
	}
	if err := st.SetSettings(ctx, "a", presence.Settings{LastSeen: presence.Nobody}); err != nil {
		t.Fatal(err)
	}
	if s, err := st.Settings(ctx, "a"); err != nil || s.LastSeen != presence.Nobody {
		t.Errorf("settings: %+v, %v", s, err)
	}
	if err := st.SetSettings(ctx, "a", presence.Settings{LastSeen: "friends"}); !errors.Is(err, presence.ErrInvalidVisibility) {
		t.Errorf("set an unknown visibility: %v", err)
	}
	if err := st.SetSettings(ctx, "a b", presence.Settings{}); !errors.Is(err, presence.ErrInvalidUserID) {
		t.Errorf("set settings of an invalid id: %v", err)
	}
}

// TestEnsureBucket: opening is idempotent, and brings an existing bucket
// to the configuration asked for.
func TestEnsureBucket(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx := context.Background()
	if _, err := presence.Open(ctx, nc, presence.BucketOptions{MarkerTTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	st, err := presence.Open(ctx, nc, presence.BucketOptions{MarkerTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	kv := bucketKV(t, st, presence.ConnsBucket)
	status, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status.LimitMarkerTTL() != 5*time.Second || status.History() != 1 {
		t.Errorf("conns bucket: marker TTL %v, history %d", status.LimitMarkerTTL(), status.History())
	}
	if err := st.Ready(ctx); err != nil {
		t.Errorf("Ready: %v", err)
	}
	if _, err := presence.Open(ctx, nc, presence.BucketOptions{Replicas: 9}); err == nil {
		t.Error("opened with invalid options")
	}
}

// TestEnsureBucketKeepsOperatorSettings: bringing a bucket up to date
// changes what greendot sets and keeps what its operator chose.
func TestEnsureBucketKeepsOperatorSettings(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// As `nats kv add presence_status --storage memory --max-bytes 1MiB
	// --compress` would make it, with greendot's history not yet set.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: presence.StatusBucket,
		Storage: jetstream.MemoryStorage, MaxBytes: 1 << 20, Compression: true}); err != nil {
		t.Fatal(err)
	}
	st, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatalf("Open over a bucket made by hand: %v", err)
	}
	status, err := bucketKV(t, st, presence.StatusBucket).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := status.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
	if status.History() != presence.StatusHistory || cfg.Storage != jetstream.MemoryStorage || cfg.MaxBytes != 1<<20 || cfg.Compression != jetstream.S2Compression {
		t.Errorf("status bucket: history %d, storage %v, max bytes %d, compression %v; want %d, memory, 1 MiB, s2",
			status.History(), cfg.Storage, cfg.MaxBytes, cfg.Compression, presence.StatusHistory)
	}
}
