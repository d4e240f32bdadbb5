package presence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// TestListingDuringPurge: a lease's keys are listed while the reaper purges
// them (a second reaper ending the same lease, or a test waiting for the
// purge). Every listing ends: none waits forever for keys that went. A
// stalled watcher is given up on after 100 ms here, not ListStall, so that
// the rounds whose watcher stalls (about one in five under -race) do not
// take the test's time.
func TestListingDuringPurge(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{})
	presence.SetListStall(st, 100*time.Millisecond)
	ctx := context.Background()
	for round := range 200 {
		epoch := fmt.Sprintf("E%d", round)
		for i := range 20 {
			c := presence.LeaseConn{Gateway: "gw1", Epoch: epoch, UserID: fmt.Sprintf("u%d", i), ConnID: "c1"}
			if _, err := st.CreateLeaseConn(ctx, c, presence.ConnRecord{Gateway: "gw1", Lease: epoch}); err != nil {
				t.Fatal(err)
			}
		}
		done := make(chan error, 1)
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		go func() {
			_, err := st.LeaseConns(lctx, "gw1", epoch)
			done <- err
		}()
		if err := st.RemoveLeaseConns(ctx, "gw1", epoch); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := <-done
		cancel()
		if err != nil || time.Since(start) > 10*time.Second {
			t.Fatalf("round %d: listing the lease's keys during their purge: %v after %v", round, err, time.Since(start))
		}
	}
}
