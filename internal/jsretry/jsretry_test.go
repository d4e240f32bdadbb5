package jsretry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
)

// TestUntil: a try that got no answer in time is tried again after
// pauses that double up to the most; an answer that refuses is returned
// at once; the end of ctx stops the tries.
func TestUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errs := []error{context.DeadlineExceeded, fmt.Errorf("request: %w", nats.ErrTimeout), nats.ErrNoResponders, context.DeadlineExceeded}
		var at []time.Time
		var told []time.Duration
		v, err := Until(context.Background(), time.Second, 3*time.Second, func() (int, error) {
			at = append(at, time.Now())
			if len(errs) > 0 {
				err := errs[0]
				errs = errs[1:]
				return 0, err
			}
			return 7, nil
		}, func(_ error, pause time.Duration) { told = append(told, pause) })
		if v != 7 || err != nil || len(at) != 5 {
			t.Fatalf("got %d, %v after %d tries; want 7 after 5", v, err, len(at))
		}
		want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}
		for i, w := range want {
			if told[i] != w || at[i+1].Sub(at[i]) != w {
				t.Errorf("pause %d: told %v, took %v; want %v", i+1, told[i], at[i+1].Sub(at[i]), w)
			}
		}
	})
	refused := errors.New("nats: API error: code=400 err_code=10012")
	tries := 0
	if _, err := Until(context.Background(), time.Second, time.Second, func() (int, error) { tries++; return 0, refused }, nil); !errors.Is(err, refused) || tries != 1 {
		t.Errorf("a refusal: %v after %d tries, want it at once", err, tries)
	}
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := Until(ctx, time.Second, time.Second, func() (int, error) { return 0, context.DeadlineExceeded }, func(error, time.Duration) {})
		if err == nil || ctx.Err() == nil {
			t.Errorf("tries went on past ctx's end: %v", err)
		}
	})
}
