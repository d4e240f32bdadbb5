package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// unansweredJS answers CreateOrUpdateConsumer with errs, one per call, and
// then with success; the rest of jetstream.JetStream is not used.
type unansweredJS struct {
	jetstream.JetStream
	errs  []error
	calls int
	at    []time.Time
}

func (j *unansweredJS) CreateOrUpdateConsumer(context.Context, string, jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	j.calls++
	j.at = append(j.at, time.Now())
	if len(j.errs) > 0 {
		err := j.errs[0]
		j.errs = j.errs[1:]
		return nil, err
	}
	return nil, nil
}

// TestCreateConsumerTriesAgain: a consumer whose creation got no answer in
// time (a cluster electing its leaders) is asked for again, after pauses
// that double; a refusal is returned at once; a canceled start stops the
// tries.
func TestCreateConsumerTriesAgain(t *testing.T) {
	c := &Consumer{log: slog.New(slog.DiscardHandler)}
	synctest.Test(t, func(t *testing.T) {
		js := &unansweredJS{errs: []error{context.DeadlineExceeded, fmt.Errorf("request: %w", nats.ErrTimeout), nats.ErrNoResponders}}
		var told []error
		if _, err := c.createConsumer(context.Background(), js, "KV_x", jetstream.ConsumerConfig{Durable: "d"}, func(err error) { told = append(told, err) }); err != nil {
			t.Fatal(err)
		}
		if js.calls != 4 {
			t.Fatalf("%d calls, want 4 (3 unanswered, then created)", js.calls)
		}
		// Each unanswered request is told, for Ready to say why the
		// start waits.
		if len(told) != 3 || !errors.Is(told[0], context.DeadlineExceeded) || !errors.Is(told[1], nats.ErrTimeout) || !errors.Is(told[2], nats.ErrNoResponders) {
			t.Errorf("told %v, want the 3 unanswered requests' errors", told)
		}
		for i, want := range []time.Duration{retryFirst, 2 * retryFirst, 4 * retryFirst} {
			if got := js.at[i+1].Sub(js.at[i]); got != want {
				t.Errorf("pause %d: %v, want %v", i+1, got, want)
			}
		}
	})
	synctest.Test(t, func(t *testing.T) {
		refused := errors.New("nats: API error: code=400 err_code=10012 consumer create failed")
		js := &unansweredJS{errs: []error{refused}}
		if _, err := c.createConsumer(context.Background(), js, "KV_x", jetstream.ConsumerConfig{Durable: "d"}, nil); !errors.Is(err, refused) || js.calls != 1 {
			t.Errorf("a refusal: %v after %d calls, want it at once", err, js.calls)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		errs := make([]error, 100)
		for i := range errs {
			errs[i] = context.DeadlineExceeded
		}
		js := &unansweredJS{errs: errs}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if _, err := c.createConsumer(ctx, js, "KV_x", jetstream.ConsumerConfig{Durable: "d"}, nil); err == nil || ctx.Err() == nil {
			t.Errorf("tries went on past the start's end: %v", err)
		}
	})
}
