package presence_test

import (
	"context"
	"errors"
	"fmt"
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
