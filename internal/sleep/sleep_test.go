package sleep_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/greendot/greendot/internal/sleep"
)

func TestFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if err := sleep.For(t.Context(), time.Minute); err != nil {
			t.Fatalf("For = %v", err)
		}
		if got := time.Since(start); got != time.Minute {
			t.Errorf("For waited %v, want 1m", got)
		}

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start = time.Now()
		if err := sleep.For(ctx, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("For past the context's end = %v, want its error", err)
		}
		if got := time.Since(start); got != time.Second {
			t.Errorf("For returned after %v, want 1s, when the context ended", got)
		}

		if err := sleep.For(t.Context(), 0); err != nil {
			t.Errorf("For(0) = %v", err)
		}
		if err := sleep.For(ctx, 0); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("For(0) of an ended context = %v, want its error", err)
		}
	})
}
