package bench

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// sampleNow is a sampler that only notes when it was called.
func sampleNow(context.Context) sample { return sample{at: time.Now()} }

// TestDuringSamplesTheLoadsWindow checks that the window the CPU is
// reckoned over is the load's, from its start to its end, and not the wait
// for its last deliveries nor the time before it starts.
func TestDuringSamplesTheLoadsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		from := time.Now().Add(time.Second)
		const d = 10 * time.Second
		a, b, err := during(t.Context(), from, d, sampleNow, func() error {
			// A second until the load starts, the load, then a settle.
			time.Sleep(time.Second + d + 8*time.Second)
			return nil
		})
		if err != nil {
			t.Fatalf("during = %v", err)
		}
		if !a.at.Equal(from) || !b.at.Equal(from.Add(d)) {
			t.Errorf("sampled at %v and %v after the start, want 0s and %v", a.at.Sub(from), b.at.Sub(from), d)
		}
	})
}

// TestDuringEndsWithAFailedRun checks that a run that fails before the
// window has passed is answered at once, and no sample is taken after it.
func TestDuringEndsWithAFailedRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		failed := errors.New("worker failed")
		samples := 0
		_, _, err := during(t.Context(), start, time.Minute, func(context.Context) sample {
			samples++
			return sample{at: time.Now()}
		}, func() error {
			time.Sleep(time.Second)
			return failed
		})
		if !errors.Is(err, failed) {
			t.Fatalf("during = %v, want %v", err, failed)
		}
		if waited := time.Since(start); waited != time.Second || samples != 1 {
			t.Errorf("during returned after %v with %d samples, want 1s and 1", waited, samples)
		}
	})
}
