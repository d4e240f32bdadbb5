package durable

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/sleep"
)

// reader hands one consumer's messages to its handler until stopped.
type reader interface {
	// stop asks it to fetch no more.
	stop()
	// wait returns once every message it fetched was handled.
	wait()
}

// consumeReader reads with nats.go's Consume: a message at a time, as the
// server sends them.
type consumeReader struct{ cc jetstream.ConsumeContext }

func (r consumeReader) stop() { r.cc.Drain() }
func (r consumeReader) wait() { <-r.cc.Closed() }

// batchReader reads in batches (Stream.PullEvery) on a goroutine of its
// own.
type batchReader struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *batchReader) stop() { r.cancel() }
func (r *batchReader) wait() { <-r.done }

const (
	// defaultBatch is the most messages one batch request asks for when
	// Stream.PullMaxMessages is zero.
	defaultBatch = 500
	// longPoll is how long a request waiting for the next message lasts
	// on the server, and longPollHeartbeat how often the server says it
	// still holds it: what a quiet consumer costs NATS.
	longPoll          = 30 * time.Second
	longPollHeartbeat = 15 * time.Second
	// retryFirst and retryMost bound the pause after a failed request.
	retryFirst = 100 * time.Millisecond
	retryMost  = 5 * time.Second
)

// nextRetry returns the pause after a failed request that followed a
// pause of prev (0 for the first failure): retryFirst, doubling up to
// retryMost.
func nextRetry(prev time.Duration) time.Duration {
	return min(max(2*prev, retryFirst), retryMost)
}

// pullBatches starts reading st's consumer in batches.
func (c *Consumer) pullBatches(cons jetstream.Consumer, st Stream) reader {
	ctx, cancel := context.WithCancel(context.Background())
	r := &batchReader{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		c.readBatches(ctx, cons, st)
	}()
	return r
}

// readBatches hands st's messages to its handler, in the order the server
// sends them, until ctx is canceled: a request for what waits, and, when
// nothing does, one that waits for the next message; after a batch shorter
// than the most it may hold, a pause of st.PullEvery lets the next one
// gather. A failed request is tried again after a pause that doubles up
// to retryMost.
func (c *Consumer) readBatches(ctx context.Context, cons jetstream.Consumer, st Stream) {
	most := cmp.Or(st.PullMaxMessages, defaultBatch)
	var backoff time.Duration
	for {
		n := 0
		batch, err := cons.FetchNoWait(most)
		if err == nil {
			n, err = handleAll(batch, st.Handle)
		}
		if err == nil && n == 0 {
			n, err = waitNext(ctx, cons, st.Handle)
		}
		if ctx.Err() != nil {
			return
		}
		pause := st.PullEvery
		switch {
		case err != nil:
			backoff = nextRetry(backoff)
			pause = backoff
			c.log.Warn("fetch from the durable consumer", "consumer", st.Consumer.Durable, "stream", st.streamName(), "err", err, "retry_in", backoff)
		case n >= most:
			backoff = 0
			continue // more may wait
		default:
			backoff = 0
		}
		if sleep.For(ctx, pause) != nil {
			return
		}
	}
}

// handleAll hands every message of a batch to handle, and returns how many
// there were and the batch's error.
func handleAll(batch jetstream.MessageBatch, handle func(jetstream.Msg)) (int, error) {
	n := 0
	for msg := range batch.Messages() {
		handle(msg)
		n++
	}
	return n, batch.Error()
}

// waitNext waits up to longPoll for the next message, or until ctx is
// canceled, and hands it to handle. A wait that ends without one is not
// an error.
func waitNext(ctx context.Context, cons jetstream.Consumer, handle func(jetstream.Msg)) (int, error) {
	// The request expires on the server a second before this context
	// ends (jetstream.FetchContext): after a little more than longPoll,
	// which the heartbeat needs.
	wctx, cancel := context.WithTimeout(ctx, longPoll+2*time.Second)
	defer cancel()
	msg, err := cons.Next(jetstream.FetchContext(wctx), jetstream.FetchHeartbeat(longPollHeartbeat))
	if msg != nil {
		handle(msg)
		return 1, nil
	}
	if ctx.Err() != nil || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return 0, nil
	}
	return 0, err
}
