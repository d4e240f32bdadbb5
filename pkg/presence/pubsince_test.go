package presence_test

import (
	"context"
	"testing"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// TestPubSince: a revision that leaves the public view as it was says
// since which revision it has not moved; one that moves it, or makes the
// record, says 0.
func TestPubSince(t *testing.T) {
	ctx := context.Background()
	store, err := presence.Open(ctx, natstest.Connect(t, natstest.RunServer(t)), presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	write := func(mutate func(*presence.Record)) presence.Write {
		t.Helper()
		w, err := store.WriteStatus(ctx, "ada", &presence.Cached{}, func(r *presence.Record) error {
			mutate(r)
			return nil
		})
		if err != nil || !w.Written {
			t.Fatalf("written %v, %v", w.Written, err)
		}
		return w
	}
	online := write(func(r *presence.Record) { r.SetConn("c1", presence.ConnInfo{Gateway: "gw1", Lease: "E"}) })
	second := write(func(r *presence.Record) { r.SetConn("c2", presence.ConnInfo{Gateway: "gw2", Lease: "E"}) })
	third := write(func(r *presence.Record) { r.SetConn("c3", presence.ConnInfo{Gateway: "gw2", Lease: "E"}) })
	busy := write(func(r *presence.Record) { r.Chosen = presence.Busy })
	for _, tt := range []struct {
		name string
		w    presence.Write
		want uint64
	}{
		{"the record made", online, 0},
		{"a second device", second, online.Rev},
		{"a third device", third, online.Rev},
		{"busy", busy, 0},
	} {
		if got := tt.w.Next.PubSince; got != tt.want {
			t.Errorf("%s (revision %d): PubSince %d, want %d", tt.name, tt.w.Rev, got, tt.want)
		}
	}
}
