// Package jsretry asks JetStream again when a request got no answer in
// time: a cluster still electing its leaders, or too busy, answers later,
// where a refusal stands.
package jsretry

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/internal/sleep"
)

// Unanswered reports whether err says that a JetStream request got no
// answer in time, rather than an answer that refused it.
func Unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)
}

// Until calls try until it succeeds or fails with an answer (returned at
// once), or ctx ends: after a try that got no answer in time, it tells
// unanswered and pauses, first for first, doubling up to most.
func Until[T any](ctx context.Context, first, most time.Duration, try func() (T, error), unanswered func(err error, pause time.Duration)) (T, error) {
	var pause time.Duration
	for {
		v, err := try()
		if err == nil || ctx.Err() != nil || !Unanswered(err) {
			return v, err
		}
		pause = min(max(2*pause, first), most)
		unanswered(err, pause)
		if err := sleep.For(ctx, pause); err != nil {
			return v, err
		}
	}
}
