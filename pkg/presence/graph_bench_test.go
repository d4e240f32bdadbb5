//go:build unix

package presence_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// BenchmarkGraphReads compares the ways of asking whether a user follows
// each of 50 others in a follow graph of users who follow 50 each: one
// read per edge, several at once; one read of the user's follows (a
// batch, as Following reads them); and one listing of them (a watcher,
// the batch's fallback), in graphs of two sizes. cpu-ns/op counts the
// process's CPU, the embedded NATS server's included.
func BenchmarkGraphReads(b *testing.B) {
	for _, users := range []int{200, 2000} {
		b.Run(fmt.Sprintf("keys=%d", users*50), func(b *testing.B) {
			srv := natstest.RunServer(b)
			st, err := presence.Open(context.Background(), natstest.Connect(b, srv), presence.BucketOptions{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for u := range users {
				for v := range 50 {
					if err := st.Follow(ctx, fmt.Sprintf("u%d", u), fmt.Sprintf("u%d", (u+v+1)%users)); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.Run("edge", func(b *testing.B) {
				measureCPU(b, func(i int) error {
					_, err := st.Follows(ctx, fmt.Sprintf("u%d", i%users), fmt.Sprintf("u%d", (i+1+i%50)%users))
					return err
				})
			})
			b.Run("batch", func(b *testing.B) {
				measureCPU(b, func(i int) error {
					_, err := st.Following(ctx, fmt.Sprintf("u%d", i%users))
					return err
				})
			})
			b.Run("listing", func(b *testing.B) {
				measureCPU(b, func(i int) error {
					_, err := presence.FollowingListed(st, ctx, fmt.Sprintf("u%d", i%users))
					return err
				})
			})
		})
	}
}

// measureCPU runs op b.N times and reports the process's CPU per op.
func measureCPU(b *testing.B, op func(i int) error) {
	c0 := processCPU()
	i := 0
	for b.Loop() {
		if err := op(i); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(processCPU()-c0)/float64(i), "cpu-ns/op")
}

// processCPU returns the CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
