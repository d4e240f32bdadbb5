package presence_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// TestOnConflictCountsLostWrites makes a compare-and-set write lose to
// another writer, and checks the hook sees it once and the write is
// retried over the winner's revision.
func TestOnConflictCountsLostWrites(t *testing.T) {
	s := natstest.RunServer(t)
	ctx := context.Background()
	store, err := presence.Open(ctx, natstest.Connect(t, s), presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := presence.Open(ctx, natstest.Connect(t, s), presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var conflicts atomic.Int64
	store.OnConflict(func() { conflicts.Add(1) })

	calls := 0
	rec, _, written, err := store.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
		calls++
		if calls == 1 {
			// Another writer gets in between this read and its write.
			if _, _, _, err := other.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
				r.Chosen = presence.Busy
				return nil
			}); err != nil {
				t.Fatalf("other writer: %v", err)
			}
		}
		r.SetConn("c1", presence.ConnInfo{Gateway: "gw", Since: 1, Rev: 1})
		return nil
	})
	if err != nil || !written {
		t.Fatalf("UpdateStatus = %v, written %v", err, written)
	}
	if got := conflicts.Load(); got != 1 {
		t.Errorf("conflicts = %d, want 1", got)
	}
	if calls != 2 {
		t.Errorf("mutate called %d times, want 2", calls)
	}
	if rec.Chosen != presence.Busy || len(rec.Conns) != 1 {
		t.Errorf("record = %+v: the retry should keep the other writer's change", rec)
	}

	// No conflict, no call.
	if _, _, _, err := store.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
		r.Chosen = presence.Online
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := conflicts.Load(); got != 1 {
		t.Errorf("conflicts after an uncontended write = %d, want 1", got)
	}
}
