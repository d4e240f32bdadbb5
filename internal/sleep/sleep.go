// Package sleep waits for a while unless a context ends first: the pause
// between tries of a retry loop, or the wait of a measurement.
package sleep

import (
	"context"
	"time"
)

// For waits d, and returns ctx's error if ctx ends first (or has ended,
// for a d of zero or less), nil otherwise.
func For(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
