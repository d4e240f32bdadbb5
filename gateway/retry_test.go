package gateway

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// TestRetryEach: what fails is tried again, alone, after pauses that
// double up to retryMax, until it succeeds; what succeeded is not done
// twice; a canceled context ends the retries.
func TestRetryEach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// b fails 6 times, c twice; a never.
		failures := map[string]int{"b": 6, "c": 2}
		var calls []string
		var pauses []time.Duration
		start := time.Now()
		retryEach(t.Context(), []string{"a", "b", "c"}, func(s string) error {
			calls = append(calls, s)
			if failures[s] > 0 {
				failures[s]--
				return errors.New("not now")
			}
			return nil
		}, func(s string, _ error, pause time.Duration) {
			if s == "b" {
				pauses = append(pauses, pause)
			}
		})
		want := []string{"a", "b", "c", "b", "c", "b", "c", "b", "b", "b", "b"}
		if !slices.Equal(calls, want) {
			t.Errorf("calls %v, want %v", calls, want)
		}
		wantPauses := []time.Duration{retryFirst, 2 * retryFirst, 4 * retryFirst, 8 * retryFirst, 16 * retryFirst, retryMax}
		if !slices.Equal(pauses, wantPauses) {
			t.Errorf("pauses before b's retries %v, want %v", pauses, wantPauses)
		}
		var total time.Duration
		for _, p := range wantPauses {
			total += p
		}
		if took := time.Since(start); took != total {
			t.Errorf("took %v of virtual time, want the pauses' sum %v", took, total)
		}
	})

	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		tries := 0
		done := make(chan struct{})
		go func() {
			defer close(done)
			retryEach(ctx, []int{1}, func(int) error { tries++; return errors.New("never") }, func(int, error, time.Duration) {})
		}()
		time.Sleep(time.Minute)
		cancel()
		<-done
		// Tries at 0, 0.25, 0.75, 1.75 and 3.75 s, then every 5 s from
		// 7.75 s to 57.75 s: 16 in a minute, and none after the cancel.
		if tries != 16 {
			t.Errorf("%d tries in a minute, want 16", tries)
		}
	})
}
