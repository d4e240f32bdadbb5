package presence_test

import (
	"context"
	"testing"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// BenchmarkStatusWrite measures one status change of a user with one
// connection on an embedded server: as a reader-then-writer does it
// (UpdateStatus: a read, then a compare-and-set), and as the user's
// gateway does it (WriteStatus from its cached copy: the compare-and-set
// alone). requests/op counts the messages the client sent to NATS.
func BenchmarkStatusWrite(b *testing.B) {
	ctx := context.Background()
	srv := natstest.RunServer(b)
	nc := natstest.Connect(b, srv)
	st, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		b.Fatal(err)
	}
	setup := func(b *testing.B, user string) {
		_, _, _, err := st.UpdateStatus(ctx, user, func(r *presence.Record) error {
			r.SetConn("c1", presence.ConnInfo{Gateway: "gw1", Lease: "1", Device: "web", Since: 1})
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	toggle := func(i int) func(*presence.Record) error {
		return func(r *presence.Record) error {
			r.Chosen = []presence.Status{presence.Busy, presence.Away}[i%2]
			return nil
		}
	}
	run := func(b *testing.B, write func(i int) error) {
		before := nc.Stats().OutMsgs
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			if err := write(i); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(nc.Stats().OutMsgs-before)/float64(b.N), "requests/op")
	}
	b.Run("read+cas", func(b *testing.B) {
		setup(b, "bench_read")
		run(b, func(i int) error {
			_, _, _, err := st.UpdateStatus(ctx, "bench_read", toggle(i))
			return err
		})
	})
	b.Run("cached_cas", func(b *testing.B) {
		setup(b, "bench_cached")
		var cache presence.Cached
		run(b, func(i int) error {
			_, err := st.WriteStatus(ctx, "bench_cached", &cache, toggle(i))
			return err
		})
	})
}
