package presence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// replaceBucket deletes a bucket and creates it again over another
// connection, as an operator's `nats kv del` and `greendot buckets` do, or
// NATS coming back without its storage.
func replaceBucket(t *testing.T, st *presence.Store, bucket string) {
	t.Helper()
	ctx := context.Background()
	if err := st.JetStream().DeleteKeyValue(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	if _, err := presence.EnsureBucket(ctx, st.JetStream(), bucket, presence.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestReplaced: a store tells a bucket created again since it opened it,
// and Ready says so; a missing bucket is not taken for a replaced one.
func TestReplaced(t *testing.T) {
	ctx := context.Background()
	st, _ := openStore(t, presence.BucketOptions{})
	if replaced, err := st.Replaced(ctx); replaced || err != nil {
		t.Fatalf("Replaced = %v, %v on the buckets opened", replaced, err)
	}
	if err := st.Ready(ctx); err != nil {
		t.Fatalf("Ready = %v", err)
	}

	if err := st.JetStream().DeleteKeyValue(ctx, presence.RoomsBucket); err != nil {
		t.Fatal(err)
	}
	replaced, err := st.Replaced(ctx)
	if replaced || err == nil || errors.Is(err, presence.ErrStoreReplaced) {
		t.Fatalf("Replaced = %v, %v with a bucket missing, want false and an error that is not ErrStoreReplaced", replaced, err)
	}

	if _, err := presence.EnsureBucket(ctx, st.JetStream(), presence.RoomsBucket, presence.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	replaced, err = st.Replaced(ctx)
	if !replaced || !errors.Is(err, presence.ErrStoreReplaced) {
		t.Fatalf("Replaced = %v, %v after the bucket was created again, want true and ErrStoreReplaced", replaced, err)
	}
	if err := st.Ready(ctx); !errors.Is(err, presence.ErrStoreReplaced) {
		t.Fatalf("Ready = %v, want ErrStoreReplaced", err)
	}

	// A store opened now takes the buckets as they are.
	again, err := presence.Open(ctx, st.NATS(), presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Ready(ctx); err != nil {
		t.Fatalf("Ready of a store opened after = %v", err)
	}
}

// TestDistrustCopies: after DistrustCopies, a write from a copy made
// before reads the record first. Without it, a copy whose revision
// happens to be that of the record in a bucket created again since is
// written from, and the record's connections are lost.
func TestDistrustCopies(t *testing.T) {
	ctx := context.Background()
	srv := natstest.RunServer(t)
	st, err := presence.Open(ctx, natstest.Connect(t, srv), presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cache presence.Cached
	conn := func(gw string) func(*presence.Record) error {
		return func(r *presence.Record) error {
			r.SetConn("c-"+gw, presence.ConnInfo{Gateway: gw})
			return nil
		}
	}
	if _, err := st.WriteStatus(ctx, "alice", &cache, conn("old")); err != nil {
		t.Fatal(err)
	}

	// The bucket is replaced, and alice's record written there by
	// another gateway at the revision the copy has.
	replaceBucket(t, st, presence.StatusBucket)
	other, err := presence.Open(ctx, natstest.Connect(t, srv), presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, rev, _, err := other.UpdateStatus(ctx, "alice", conn("new"))
		if err != nil {
			t.Fatal(err)
		}
		if rev >= cache.Rev {
			if rev != cache.Rev {
				t.Fatalf("the new record is at %d, past the copy's %d", rev, cache.Rev)
			}
			break
		}
		// Another user's record moves the bucket's revisions on.
		if _, _, _, err := other.UpdateStatus(ctx, "bob", conn("new")); err != nil {
			t.Fatal(err)
		}
	}

	st.DistrustCopies()
	if _, err := st.WriteStatus(ctx, "alice", &cache, func(r *presence.Record) error {
		r.Chosen = presence.Busy
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rec, _, err := st.Status(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.Conns["c-new"]; !ok || rec.Chosen != presence.Busy {
		t.Errorf("alice's record after the write = %+v, want the connection written in the new bucket and busy", rec)
	}
}
