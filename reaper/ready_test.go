package reaper_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
)

// TestReadyNamesTheStartupSweep starts a reaper whose start-up sweep
// cannot finish for a while: the connection keys' stream takes no more
// consumers than the reaper's own durable one, so the sweep, once it has
// read the lease and the status records, cannot list the keys, and tries
// again. Meanwhile Ready says that it waits for the sweep, how far the
// failed attempt read (status records it skipped as not greendot's
// included), and why it failed; once the stream takes consumers again,
// the sweep goes through and the reaper is ready.
func TestReadyNamesTheStartupSweep(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{})
	ctx := context.Background()
	w.takeLease("gw1", "e1", time.Hour)
	const users = 30
	for i := range users {
		w.register("gw1", "e1", fmt.Sprintf("user%d", i), "c1")
	}
	js := w.store.JetStream()
	status, err := js.KeyValue(ctx, presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	undecodable := []string{`not JSON`, `[1, 2]`, `{"status": 5}`}
	for i, v := range undecodable {
		if _, err := status.Put(ctx, fmt.Sprintf("junk%d", i), []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, presence.StreamName(presence.ConnsBucket))
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	limited := cfg
	limited.MaxConsumers = 1 // the reaper's durable consumer
	if _, err := js.UpdateStream(ctx, limited); err != nil {
		t.Fatal(err)
	}

	r, _ := w.runReaper(natstest.Connect(t, w.srv), reaper.Config{})

	// The lease and every status record were read before the listing
	// failed.
	read := fmt.Sprintf("%d records read", 1+users+len(undecodable))
	natstest.CheckFor(t, patience, 10*time.Millisecond, func() error {
		err := r.Ready(ctx)
		if !errors.Is(err, reaper.ErrNotReady) || !strings.Contains(err.Error(), "start-up sweep") ||
			!strings.Contains(err.Error(), read) || !strings.Contains(err.Error(), "maximum consumers limit reached") {
			return fmt.Errorf("Ready = %v; want not ready, naming the start-up sweep, %s and its failure", err, read)
		}
		t.Logf("Ready: %v", err)
		return nil
	})

	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, patience, 10*time.Millisecond, func() error { return r.Ready(ctx) })
}
