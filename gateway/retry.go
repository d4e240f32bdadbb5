package gateway

import (
	"context"
	"time"

	"github.com/greendot/greendot/internal/sleep"
)

// The pauses of retryEach: the first, and the longest it doubles to.
const (
	retryFirst = 250 * time.Millisecond
	retryMax   = 5 * time.Second
)

// retryEach calls do with each of items, then again with those it failed
// for, after a pause that doubles from retryFirst to retryMax, until it
// has succeeded for every item or ctx ends. failed is told of each
// failure and the pause before the next try. It is for what must be done
// once NATS is back (reading again what may have been missed while it was
// away), where a failed read left as it is would leave a watcher wrong
// until the next reconnect.
func retryEach[T any](ctx context.Context, items []T, do func(T) error, failed func(T, error, time.Duration)) {
	pause := retryFirst
	for len(items) > 0 && ctx.Err() == nil {
		var again []T
		for _, it := range items {
			if ctx.Err() != nil {
				return
			}
			if err := do(it); err != nil && ctx.Err() == nil {
				failed(it, err, pause)
				again = append(again, it)
			}
		}
		if len(again) == 0 {
			return
		}
		if sleep.For(ctx, pause) != nil {
			return
		}
		items, pause = again, min(2*pause, retryMax)
	}
}
