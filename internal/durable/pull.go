package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/sleep"
)

// reader hands one consumer's messages to its handler, on a goroutine of
// its own, until stopped.
type reader struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stop asks it to fetch no more.
func (r *reader) stop() { r.cancel() }

// wait returns once every message it fetched was handled.
func (r *reader) wait() { <-r.done }

// goRead runs read on a goroutine of its own until the reader is stopped.
func goRead(read func(ctx context.Context)) *reader {
	ctx, cancel := context.WithCancel(context.Background())
	r := &reader{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		read(ctx)
	}()
	return r
}

// startReader starts handing st's messages to its handler: in batches
// (Stream.PullEvery), or else with nats.go's Consume, a message at a time
// as the server sends them. Either way the reader outlives its consumer:
// should the consumer go (deleted by hand, or lost by the cluster), it
// creates it again (see recreate).
func (c *Consumer) startReader(js jetstream.JetStream, cons jetstream.Consumer, st Stream) (*reader, error) {
	if st.PullEvery > 0 {
		return goRead(func(ctx context.Context) { c.readBatches(ctx, js, cons, st) }), nil
	}
	suspect := make(chan struct{}, 1)
	cc, err := cons.Consume(st.Handle, consumeOpts(st, suspect)...)
	if err != nil {
		return nil, err
	}
	return goRead(func(ctx context.Context) { c.keepConsuming(ctx, js, cons, cc, st, suspect) }), nil
}

// consumeOpts returns the options of a Consume of st's consumer. Its
// errors that may say the consumer is gone are told on suspect: nats.go
// ends a Consume for good when its consumer is deleted while it waits
// ("409 Consumer Deleted"), and one whose consumer was deleted while the
// connection was away only ever hears "no responders".
func consumeOpts(st Stream, suspect chan<- struct{}) []jetstream.PullConsumeOpt {
	var opts []jetstream.PullConsumeOpt
	if st.PullMaxMessages > 0 {
		opts = append(opts, jetstream.PullMaxMessages(st.PullMaxMessages))
	}
	opts = append(opts, st.PullOptions...)
	return append(opts, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if mayBeGone(err) {
			select {
			case suspect <- struct{}{}:
			default: // one is enough
			}
		}
	}))
}

// keepConsuming watches cc, a Consume of st's consumer, until ctx is
// canceled, then drains it. A Consume that ended by itself, or whose
// consumer the server says is gone, is replaced by one of the consumer
// created again.
func (c *Consumer) keepConsuming(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, cc jetstream.ConsumeContext, st Stream, suspect chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			cc.Drain()
			<-cc.Closed()
			return
		case <-cc.Closed():
		case <-suspect:
			if !c.gone(ctx, cons) {
				continue
			}
			cc.Stop()
			<-cc.Closed()
		}
		cons = c.recreate(ctx, js, st, func(cons jetstream.Consumer) (err error) {
			cc, err = cons.Consume(st.Handle, consumeOpts(st, suspect)...)
			return err
		})
		if cons == nil {
			return
		}
	}
}

// mayBeGone reports whether err, from reading a consumer, may say that
// the consumer is gone: deleted while a request waited, or no longer
// there to answer one (no responders; but so it is for a moment while a
// cluster elects its leaders).
func mayBeGone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, nats.ErrNoResponders)
}

// gone asks the server whether cons is gone: only an answer that there is
// no such consumer, or no such stream (deleted with its consumers), says
// so, not a request left unanswered.
func (c *Consumer) gone(ctx context.Context, cons jetstream.Consumer) bool {
	_, err := cons.Info(ctx)
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// recreate creates st's consumer again once it stopped delivering, and
// starts reading it with start (if set), both tried again after a pause
// that doubles up to retryMost, until they succeed or ctx is canceled
// (then it returns nil). The process is not ready meanwhile: whoever
// relies on it (an operator's alert, a deployment's rollout) sees that it
// does not consume. A consumer created again starts where its
// configuration says (DeliverPolicy), as one made at a first start does.
func (c *Consumer) recreate(ctx context.Context, js jetstream.JetStream, st Stream, start func(jetstream.Consumer) error) jetstream.Consumer {
	name := st.Consumer.Durable + " on " + st.streamName()
	c.setStalled(name, nil)
	defer c.delivers(name)
	c.log.Warn("the durable consumer stopped delivering: creating it again", "consumer", st.Consumer.Durable, "stream", st.streamName())
	var pause time.Duration
	for {
		cons, err := c.createConsumer(ctx, js, st.streamName(), st.Consumer, func(err error) { c.setStalled(name, err) })
		if err == nil && c.replaced(ctx, st.Bucket) {
			return nil
		}
		if err == nil && start != nil {
			err = start(cons)
		}
		if err == nil {
			c.log.Info("the durable consumer was created again: consuming", "consumer", st.Consumer.Durable, "stream", st.streamName())
			return cons
		}
		if ctx.Err() != nil {
			return nil
		}
		c.setStalled(name, err)
		pause = nextRetry(pause)
		c.log.Error("create the durable consumer again", "consumer", st.Consumer.Durable, "stream", st.streamName(), "err", err, "retry_in", pause)
		if sleep.For(ctx, pause) != nil {
			return nil
		}
	}
}

// replaced reports whether bucket, on whose stream (or one that sources
// it) a consumer was just created again, was itself created again since
// Run opened the buckets (see presence.Store.Replaced), as when NATS comes
// back without its storage, and then stops the process as a failure: the
// state it keeps between messages (the fanout's newest revisions, the
// reaper's held leases) is of the old buckets, and the consumer created
// on the new one starts where its configuration says, not where the old
// one was. It is asked once the consumer exists, so that the bucket
// does: asked before, it could find the bucket missing, and the consumer
// then be created on the new bucket.
func (c *Consumer) replaced(ctx context.Context, bucket string) bool {
	// Consumers are read, and so created again, only while the store is
	// held: from when the process is ready until it stops.
	store := c.ready.Load()
	if store == nil {
		return false
	}
	qctx, cancel := context.WithTimeout(ctx, replacedTimeout)
	replaced, err := store.Replaced(qctx, bucket)
	cancel()
	if !replaced {
		return false
	}
	c.log.Error("the buckets were replaced since the process started: stopping", "err", err)
	select {
	case c.fatal <- fmt.Errorf("%s: %w", c.cfg.Name, err):
	default:
	}
	return true
}

// replacedTimeout bounds the look at the buckets of replaced.
const replacedTimeout = 10 * time.Second

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

// readBatches hands st's messages to its handler, in the order the server
// sends them, until ctx is canceled: a request for what waits, and, when
// nothing does, one that waits for the next message; after a batch shorter
// than the most it may hold, a pause of st.PullEvery lets the next one
// gather. A failed request is tried again after a pause that doubles up
// to retryMost; one that failed because the consumer is gone, once the
// consumer is created again.
func (c *Consumer) readBatches(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, st Stream) {
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
		case err != nil && mayBeGone(err) && c.gone(ctx, cons):
			if cons = c.recreate(ctx, js, st, nil); cons == nil {
				return
			}
			backoff = 0
			continue
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
