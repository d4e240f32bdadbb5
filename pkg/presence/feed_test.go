package presence_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

func TestFeedConfig(t *testing.T) {
	cfg, err := presence.FeedConfig(presence.BucketOptions{Replicas: 3}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name != presence.FeedStream || cfg.MaxAge != presence.DefaultFeedMaxAge || cfg.Replicas != 3 ||
		cfg.MaxMsgsPerSubject != -1 || len(cfg.Subjects) != 0 || cfg.Storage != jetstream.FileStorage ||
		len(cfg.Sources) != 1 || cfg.Sources[0].Name != presence.StreamName(presence.StatusBucket) {
		t.Errorf("FeedConfig: %+v", cfg)
	}
	for _, bad := range []struct {
		o      presence.BucketOptions
		maxAge time.Duration
	}{{presence.BucketOptions{}, time.Second}, {presence.BucketOptions{}, -time.Hour}, {presence.BucketOptions{Replicas: 7}, time.Hour}} {
		if _, err := presence.FeedConfig(bad.o, bad.maxAge); err == nil {
			t.Errorf("FeedConfig(%+v, %v): no error", bad.o, bad.maxAge)
		}
	}
}

func TestFeedRevision(t *testing.T) {
	for _, tt := range []struct {
		hdr  string
		rev  uint64
		want bool
	}{
		{"KV_presence_status 42 > > $KV.presence_status.alice", 42, true},
		{"KV_presence_status 7", 7, true},
		{"KV_presence_conns 42 > > $KV.presence_conns.x", 0, false},
		{"KV_presence_status x", 0, false},
		{"KV_presence_status 0", 0, false},
		{"", 0, false},
	} {
		h := nats.Header{}
		if tt.hdr != "" {
			h.Set("Nats-Stream-Source", tt.hdr)
		}
		if rev, ok := presence.FeedRevision(h); rev != tt.rev || ok != tt.want {
			t.Errorf("FeedRevision(%q) = %d, %v; want %d, %v", tt.hdr, rev, ok, tt.rev, tt.want)
		}
	}
}

// TestEnsureFeedMaxAge: the feed's max age changes only when one is asked
// for: ensuring it again with none keeps what it has.
func TestEnsureFeedMaxAge(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()
	for _, step := range []struct {
		ask, want time.Duration
	}{
		{0, presence.DefaultFeedMaxAge}, // created
		{168 * time.Hour, 168 * time.Hour},
		{0, 168 * time.Hour},
		{2 * time.Hour, 2 * time.Hour},
		{0, 2 * time.Hour},
	} {
		feed, err := presence.EnsureFeed(ctx, st.JetStream(), presence.BucketOptions{}, step.ask)
		if err != nil {
			t.Fatal(err)
		}
		if got := feed.CachedInfo().Config.MaxAge; got != step.want {
			t.Errorf("after EnsureFeed(%v): max age %v, want %v", step.ask, got, step.want)
		}
	}
}

// TestFeedKeepsEveryRevision: the feed keeps more revisions of a user than
// the bucket, each with its bucket revision, deletions included.
func TestFeedKeepsEveryRevision(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	js := store.JetStream()
	if _, err := presence.Feed(ctx, js); !errors.Is(err, presence.ErrFeedNotFound) {
		t.Errorf("Feed before it is created: %v, want ErrFeedNotFound", err)
	}
	for range 2 { // idempotent
		if _, err := presence.EnsureFeed(ctx, js, presence.BucketOptions{}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := js.KeyValue(ctx, presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	feed, err := presence.Feed(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	// NATS copies each revision a moment after it is written, and the
	// bucket keeps only the last StatusHistory: the writes wait for each
	// copy, as a user's changes, far apart, would.
	subject := presence.KeySubject(presence.StatusBucket, "alice")
	var revs []uint64
	for i := range 2 * presence.StatusHistory {
		rev, err := kv.Put(ctx, "alice", []byte(`{"status":"online"}`))
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, rev)
		natstest.CheckFor(t, 10*time.Second, 2*time.Millisecond, func() error {
			info, err := feed.Info(ctx, jetstream.WithSubjectFilter(subject))
			if err == nil && info.State.Subjects[subject] != uint64(i+1) {
				err = fmt.Errorf("%d revisions copied, want %d", info.State.Subjects[subject], i+1)
			}
			return err
		})
	}
	if err := kv.Delete(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	want := len(revs) + 1
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		info, err := feed.Info(ctx)
		if err == nil && info.State.Msgs != uint64(want) {
			err = errors.New("not all sourced yet")
		}
		return err
	})
	info, err := feed.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAge != time.Hour {
		t.Errorf("max age %v, want 1h", info.Config.MaxAge)
	}
	for i := range want {
		msg, err := feed.GetMsg(ctx, info.State.FirstSeq+uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		rev, ok := presence.FeedRevision(msg.Header)
		if msg.Subject != presence.KeySubject(presence.StatusBucket, "alice") || !ok {
			t.Fatalf("message %d: %s %v", i, msg.Subject, msg.Header)
		}
		if i < len(revs) && rev != revs[i] || i == len(revs) && presence.EntryOp(msg.Header) != jetstream.KeyValueDelete {
			t.Errorf("message %d: revision %d, op %v", i, rev, presence.EntryOp(msg.Header))
		}
	}
	// The bucket keeps StatusHistory of them.
	hist, err := kv.History(ctx, "alice")
	if err != nil || len(hist) != presence.StatusHistory {
		t.Errorf("bucket history: %d, %v", len(hist), err)
	}
}

// pauseFeed stops NATS copying StatusBucket's revisions into the feed, by
// taking its source away; the function it returns gives it back, and the
// copy goes on from the first revision not copied.
func pauseFeed(t *testing.T, ctx context.Context, js jetstream.JetStream) (resume func()) {
	t.Helper()
	st, err := presence.Feed(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	paused := cfg
	paused.Sources = nil
	if _, err := js.UpdateStream(ctx, paused); err != nil {
		t.Fatalf("pause the feed: %v", err)
	}
	return func() {
		t.Helper()
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("resume the feed: %v", err)
		}
	}
}

// flip writes a revision of user's record: its chosen status changes.
func flip(ctx context.Context, store *presence.Store, user string) (uint64, error) {
	_, rev, _, err := store.UpdateStatus(ctx, user, func(r *presence.Record) error {
		if r.Chosen == presence.Busy {
			r.Chosen = presence.Away
		} else {
			r.Chosen = presence.Busy
		}
		return nil
	})
	return rev, err
}

// feedRevisions returns the revisions of user's record the feed holds, in
// its order.
func feedRevisions(t *testing.T, ctx context.Context, js jetstream.JetStream, user string) []uint64 {
	t.Helper()
	st, err := presence.Feed(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{presence.KeySubject(presence.StatusBucket, user)},
	})
	if err != nil {
		t.Fatal(err)
	}
	var revs []uint64
	for pending := cons.CachedInfo().NumPending; uint64(len(revs)) < pending; {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("read the feed: %v", err)
		}
		rev, ok := presence.FeedRevision(msg.Headers())
		if !ok {
			t.Fatalf("feed message without a revision: %v", msg.Headers())
		}
		revs = append(revs, rev)
	}
	return revs
}

// feedStore returns a context for the test, a connection to an embedded
// server and a store over it whose status writes wait at most wait for the
// feed's copy, and the count of those that waited in vain.
func feedStore(t *testing.T, wait time.Duration) (context.Context, *nats.Conn, *presence.Store, *atomic.Int64) {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	presence.SetFeedWait(store, wait)
	late := new(atomic.Int64)
	store.OnFeedLate(func() { late.Add(1) })
	return ctx, nc, store, late
}

// TestFeedBurstWaitsForCopy: a user who changes more often than the feed
// copies, while the bucket keeps only StatusHistory revisions, has each
// write wait for the copy where the bucket would drop one not copied yet,
// so the feed loses none of them.
func TestFeedBurstWaitsForCopy(t *testing.T) {
	ctx, nc, store, late := feedStore(t, time.Minute)
	js := store.JetStream()
	if _, err := presence.EnsureFeed(ctx, js, presence.BucketOptions{}, time.Hour); err != nil {
		t.Fatal(err)
	}
	first, err := flip(ctx, store, "alice")
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if got := feedRevisions(t, ctx, js, "alice"); len(got) != 1 {
			return fmt.Errorf("feed holds %v", got)
		}
		return nil
	})

	looks := countLooks(t, nc)

	resume := pauseFeed(t, ctx, js)
	const burst = 3 * presence.StatusHistory
	var written atomic.Int64
	revs := make(chan []uint64, 1)
	errs := make(chan error, 1)
	go func() {
		var got []uint64
		for range burst {
			rev, err := flip(ctx, store, "alice")
			if err != nil {
				errs <- err
				return
			}
			got = append(got, rev)
			written.Add(1)
		}
		revs <- got
	}()
	// The first write counts 1 revision not known to be copied; the
	// StatusHistory-th after it would drop it, and waits.
	natstest.CheckFor(t, 30*time.Second, 5*time.Millisecond, func() error {
		if n := looks.Load(); n < 3 {
			return fmt.Errorf("the feed was looked at %d times (%d writes)", n, written.Load())
		}
		return nil
	})
	if n := written.Load(); n != presence.StatusHistory-1 {
		t.Errorf("%d writes made while the feed was paused, want %d", n, presence.StatusHistory-1)
	}
	resume()
	var got []uint64
	select {
	case got = <-revs:
	case err := <-errs:
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatalf("the burst did not end: %d writes", written.Load())
	}
	want := append([]uint64{first}, got...)
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if fed := feedRevisions(t, ctx, js, "alice"); !slices.Equal(fed, want) {
			return fmt.Errorf("feed holds revisions %v, want %v", fed, want)
		}
		return nil
	})
	if n := late.Load(); n != 0 {
		t.Errorf("%d writes went ahead without the copy", n)
	}
}

// TestFeedGateGivesUp: with no feed a burst never waits, and with a feed
// that does not copy it waits FeedWait at the revisions it would drop,
// then goes ahead, counted.
func TestFeedGateGivesUp(t *testing.T) {
	ctx, _, store, late := feedStore(t, 100*time.Millisecond)
	clock := skewedClock(store)
	kv := bucketKV(t, store, presence.StatusBucket)
	burst := func(user string) {
		t.Helper()
		for range 2*presence.StatusHistory + 1 {
			if _, err := flip(ctx, store, user); err != nil {
				t.Fatal(err)
			}
		}
		e, err := kv.Get(ctx, presence.StatusKey(user))
		if err != nil {
			t.Fatal(err)
		}
		if n, err := presence.UnfedOf(e.Value()); err != nil || n < 1 || n > presence.StatusHistory {
			t.Errorf("%s's record counts %d revisions not known copied (%v)", user, n, err)
		}
	}

	burst("alice")
	if n := late.Load(); n != 0 {
		t.Errorf("without a feed, %d writes waited in vain", n)
	}

	js := store.JetStream()
	if _, err := presence.EnsureFeed(ctx, js, presence.BucketOptions{}, time.Hour); err != nil {
		t.Fatal(err)
	}
	pauseFeed(t, ctx, js)
	// The store believes the feed missing for a while after it found so.
	clock.Add(int64(presence.FeedAbsentFor))
	burst("bob")
	if n := late.Load(); n != 2 {
		t.Errorf("%d writes went ahead without the copy, want 2 (one per %d)", n, presence.StatusHistory)
	}
}

// TestFeedAbsentLookedAtOnce: with no feed, the writes that would drop a
// revision not known copied look for the feed once, not each: a look is a
// request on the stream API. A feed created meanwhile is looked at once
// that belief has run out, and its copies are waited for.
func TestFeedAbsentLookedAtOnce(t *testing.T) {
	ctx, nc, store, late := feedStore(t, time.Minute)
	clock := skewedClock(store)
	looks := countLooks(t, nc)
	burst := func(users ...string) {
		t.Helper()
		for range 2*presence.StatusHistory + 1 {
			for _, user := range users {
				if _, err := flip(ctx, store, user); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// looked returns the looks so far: the server delivers the requests
	// it has to this subscription before it answers a ping on the same
	// connection, and each look was answered before its write went on.
	looked := func() int64 {
		t.Helper()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return looks.Load()
	}

	// Six writes of three users would drop a revision; one looks.
	burst("alice", "bob", "carol")
	if n := looked(); n != 1 {
		t.Errorf("without a feed, %d looks at it, want 1", n)
	}

	js := store.JetStream()
	if _, err := presence.EnsureFeed(ctx, js, presence.BucketOptions{}, time.Hour); err != nil {
		t.Fatal(err)
	}
	clock.Add(int64(presence.FeedAbsentFor))
	burst("dave")
	if n := looked(); n < 3 {
		t.Errorf("with a feed, %d looks at it in all, want 1 and then one per %d writes of dave", n, presence.StatusHistory)
	}
	if n := late.Load(); n != 0 {
		t.Errorf("%d writes went ahead without the copy", n)
	}
}

// countLooks counts the writers' looks at the feed, which are requests on
// its stream's API, from now on.
func countLooks(t *testing.T, nc *nats.Conn) *atomic.Int64 {
	t.Helper()
	looks := new(atomic.Int64)
	sub, err := nc.Subscribe("$JS.API.STREAM.MSG.GET."+presence.FeedStream, func(*nats.Msg) { looks.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return looks
}

// skewedClock has store read the time as time.Now plus the returned
// offset (ns), which the test moves on.
func skewedClock(store *presence.Store) *atomic.Int64 {
	var offset atomic.Int64
	presence.SetNow(store, func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	return &offset
}
