package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/jsretry"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/presence"
)

// ErrNotReady is what Ready returns while the process is not ready, unless
// Config.NotReady names another error; Ready wraps it with what the
// process waits for, once Run has been called.
var ErrNotReady = errors.New("not ready")

// ErrInvalidConfig wraps every error of New about its Config.
var ErrInvalidConfig = errors.New("durable: invalid config")

// Config describes a process's durable consumer and the steps of its life
// that are its own. Name, Bucket, Consumer.Durable, Admin.Name and Handle
// are required.
type Config struct {
	// Name is the kind of process ("reaper"), as its logs say it: Run
	// logs "<name> running" once it consumes, and "<name> stopped" when
	// it returns after its context was canceled.
	Name string
	// Logger receives the lifecycle's logs; nil discards them.
	Logger *slog.Logger
	// Buckets says how buckets are created if they are missing.
	Buckets presence.BucketOptions
	// Bucket is the KV bucket whose stream is consumed.
	Bucket string
	// Stream, if set, is the stream consumed instead of Bucket's: one
	// that sources it (presence.FeedStream). Run does not create it; its
	// absence fails the start with an error that wraps
	// jetstream.ErrStreamNotFound.
	Stream string
	// Consumer configures the durable consumer on the stream. It is
	// created, or updated to this configuration, at every start.
	Consumer jetstream.ConsumerConfig
	// PullMaxMessages bounds the messages the client holds ahead of
	// Handle; zero means the nats.go default.
	PullMaxMessages int
	// PullOptions are further options of Consume, such as the priority
	// group of a consumer with a pinned client. An error handler among
	// them is replaced: the Consumer watches the errors itself.
	PullOptions []jetstream.PullConsumeOpt
	// PullEvery, if set, reads the consumer in batches instead of one
	// message at a time (see Stream.PullEvery).
	PullEvery time.Duration
	// Admin describes the process's micro service. A nil Admin.Ready means
	// the Consumer's Ready.
	Admin admin.ServiceConfig
	// NotReady is the error Ready returns before the process is ready and
	// once it is stopping, wrapped with what it waits for; nil means
	// ErrNotReady.
	NotReady error

	// Opened, if set, is called with the store once the buckets are open,
	// before anything else runs. The store works over the Consumer's NATS
	// connection.
	Opened func(store *presence.Store)
	// Prepare, if set, runs once the consumer exists and before the
	// process becomes ready: what must be done before anyone relies on
	// the process (the reaper's start-up sweep). Run returns its error,
	// unless ctx was canceled.
	Prepare func(ctx context.Context) error
	// Preparing, if set, says how the preparation is going, for Ready
	// while Prepare runs ("start-up sweep under way (12 records read)");
	// "" says "preparing". It is called from any goroutine, and must be
	// quick.
	Preparing func() string
	// Work, if set, runs on a goroutine of its own from before consuming
	// starts until the consumer is drained: it does what Handle and the
	// loops hand it. Its ctx is canceled once nothing more can be handed
	// to it (the admin service is stopped, the loops have returned and the
	// consumer is drained); it then finishes what it holds and returns.
	Work func(ctx context.Context)
	// Handle takes one message of the stream and acknowledges it, or asks
	// for its redelivery. It runs on the consumer's goroutine, one message
	// at a time.
	Handle func(msg jetstream.Msg)
	// Loops run beside consuming, each on a goroutine of its own, until
	// their ctx is canceled when the process stops, before the consumer is
	// drained.
	Loops []func(ctx context.Context)
	// More are further durable consumers of the process, each on a
	// bucket's stream, with a handler of its own; they live as the first.
	More []Stream
}

// Stream is one more durable consumer of a process (Config.More).
type Stream struct {
	// Bucket is the KV bucket whose stream is consumed.
	Bucket string
	// stream, if set, is the stream consumed instead of Bucket's.
	stream string
	// Consumer configures the durable consumer on the bucket's stream.
	Consumer jetstream.ConsumerConfig
	// PullMaxMessages bounds the messages the client holds ahead of
	// Handle; zero means the nats.go default.
	PullMaxMessages int
	// PullOptions are further options of Consume.
	PullOptions []jetstream.PullConsumeOpt
	// PullEvery, if set, reads the consumer in batches: while messages
	// come, one pull request per PullEvery, answered at once with what
	// waits (up to PullMaxMessages, and again at once when that many
	// did); while none come, one request that waits for the next. The
	// server then writes a batch to the connection in a few writes
	// rather than one per message, and the client's goroutines wake once
	// per batch; a message waits up to PullEvery longer. For consumers
	// that can afford that wait (the fanout's). PullOptions must be
	// empty.
	PullEvery time.Duration
	// Handle takes one message of the stream, as Config.Handle does.
	Handle func(msg jetstream.Msg)
}

// streamName returns the name of the stream consumed.
func (st Stream) streamName() string {
	if st.stream != "" {
		return st.stream
	}
	return presence.StreamName(st.Bucket)
}

// Consumer runs the life of a process built around a durable consumer.
// Its Ready is safe for concurrent use; Run is called once.
type Consumer struct {
	nc       *nats.Conn
	cfg      Config
	log      *slog.Logger
	notReady error
	// ready holds the store while the process is ready.
	ready atomic.Pointer[presence.Store]
	// step says what Run does while the process is not ready, for Ready:
	// nil before Run, then each step of the start ("opening its
	// buckets"), then "stopping" and "stopped". preparing is set while
	// Config.Prepare runs, whose Config.Preparing then says more.
	step      atomic.Pointer[string]
	preparing atomic.Bool
	// stalled names the consumers that stopped delivering while the
	// process runs and are being created again (see recreate), each with
	// the last error of its creation (nil before one failed): the process
	// is not ready meanwhile.
	stalledMu sync.Mutex
	stalled   map[string]error
	// fatal carries what stops the process as a failure (see recreate).
	fatal chan error
}

// New checks cfg and returns a Consumer that will use nc. It starts no
// goroutines and does no I/O. The caller owns nc.
func New(nc *nats.Conn, cfg Config) (*Consumer, error) {
	switch {
	case cfg.Name == "":
		return nil, fmt.Errorf("%w: no name", ErrInvalidConfig)
	case cfg.Bucket == "":
		return nil, fmt.Errorf("%w: no bucket", ErrInvalidConfig)
	case cfg.Consumer.Durable == "":
		return nil, fmt.Errorf("%w: no durable name", ErrInvalidConfig)
	case cfg.Admin.Name == "":
		return nil, fmt.Errorf("%w: no admin service name", ErrInvalidConfig)
	case cfg.Handle == nil:
		return nil, fmt.Errorf("%w: no message handler", ErrInvalidConfig)
	case cfg.PullMaxMessages < 0:
		return nil, fmt.Errorf("%w: pull max messages %d", ErrInvalidConfig, cfg.PullMaxMessages)
	case cfg.PullEvery < 0 || cfg.PullEvery > 0 && len(cfg.PullOptions) > 0:
		return nil, fmt.Errorf("%w: pull every %v: want 0, or more and no pull options", ErrInvalidConfig, cfg.PullEvery)
	}
	for _, m := range cfg.More {
		if m.Bucket == "" || m.Consumer.Durable == "" || m.Handle == nil || m.PullMaxMessages < 0 ||
			m.PullEvery < 0 || m.PullEvery > 0 && len(m.PullOptions) > 0 {
			return nil, fmt.Errorf("%w: consumer %q on %q: want a bucket, a durable name, a handler, a pull limit of 0 or more and a pull period of 0 or more (without pull options)", ErrInvalidConfig, m.Consumer.Durable, m.Bucket)
		}
	}
	c := &Consumer{nc: nc, cfg: cfg, log: cfg.Logger, notReady: cfg.NotReady, stalled: make(map[string]error), fatal: make(chan error, 1)}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.notReady == nil {
		c.notReady = ErrNotReady
	}
	if c.cfg.Admin.Ready == nil {
		c.cfg.Admin.Ready = c.Ready
	}
	return c, nil
}

// Ready reports whether the process runs: its buckets are open, its
// preparation has finished, it is not stopping, every one of its
// consumers delivers (none is being created again), and its NATS
// connection is up. When it is not ready, its error (Config.NotReady)
// says what the process waits for: the step of its start under way and
// the last failure of a step tried again, the preparation's progress, or
// the consumer being created again and why that failed last.
func (c *Consumer) Ready(ctx context.Context) error {
	store := c.ready.Load()
	if store == nil {
		if why := c.waitingFor(); why != "" {
			return fmt.Errorf("%w: %s", c.notReady, why)
		}
		return c.notReady
	}
	if name, err := c.firstStalled(); name != "" {
		if err != nil {
			return fmt.Errorf("%w: consumer %s stopped delivering; creating it again, which failed: %v", c.notReady, name, err)
		}
		return fmt.Errorf("%w: consumer %s stopped delivering; creating it again", c.notReady, name)
	}
	return store.Ready(ctx)
}

// waitingFor says what the process, not ready, waits for; "" before Run.
func (c *Consumer) waitingFor() string {
	if c.preparing.Load() && c.cfg.Preparing != nil {
		if why := c.cfg.Preparing(); why != "" {
			return why
		}
	}
	if step := c.step.Load(); step != nil {
		return *step
	}
	return ""
}

// setStep notes the step of Run under way, for Ready.
func (c *Consumer) setStep(format string, args ...any) {
	step := fmt.Sprintf(format, args...)
	c.step.Store(&step)
}

// setStalled notes that the consumer named name (durable and stream)
// stopped delivering and is being created again, and the last error of
// its creation (nil before one failed).
func (c *Consumer) setStalled(name string, err error) {
	c.stalledMu.Lock()
	defer c.stalledMu.Unlock()
	c.stalled[name] = err
}

// delivers notes that the consumer named name delivers again.
func (c *Consumer) delivers(name string) {
	c.stalledMu.Lock()
	defer c.stalledMu.Unlock()
	delete(c.stalled, name)
}

// firstStalled returns the name of a stalled consumer, the first in
// order, and the last error of its creation, or "" when every consumer
// delivers.
func (c *Consumer) firstStalled() (string, error) {
	c.stalledMu.Lock()
	defer c.stalledMu.Unlock()
	if len(c.stalled) == 0 {
		return "", nil
	}
	name := slices.Sorted(maps.Keys(c.stalled))[0]
	return name, c.stalled[name]
}

// Run opens the buckets, creates the consumer, prepares, starts the admin
// service, becomes ready and consumes until ctx is canceled; then it
// stops being ready, stops the admin service, stops the loops, drains the
// consumer, lets the work finish, and returns nil. It returns an error
// when the process cannot start (a start canceled by ctx is not an
// error), and, after stopping the same way, when a consumer's stream was
// found created again since the buckets were opened (an error that wraps
// presence.ErrStoreReplaced; see recreate). Every goroutine Run starts has exited when it returns.
func (c *Consumer) Run(ctx context.Context) error {
	defer c.setStep("stopped")
	c.setStep("opening its buckets")
	store, err := c.openStore(ctx)
	if err != nil {
		return startErr(ctx, err)
	}
	if c.cfg.Opened != nil {
		c.cfg.Opened(store)
	}
	streams := append([]Stream{{
		Bucket: c.cfg.Bucket, stream: c.cfg.Stream, Consumer: c.cfg.Consumer, PullMaxMessages: c.cfg.PullMaxMessages,
		PullOptions: c.cfg.PullOptions, PullEvery: c.cfg.PullEvery, Handle: c.cfg.Handle,
	}}, c.cfg.More...)
	conses := make([]jetstream.Consumer, len(streams))
	for i, st := range streams {
		stream := st.streamName()
		c.setStep("creating consumer %s on %s", st.Consumer.Durable, stream)
		cons, err := c.createConsumer(ctx, store.JetStream(), stream, st.Consumer, func(err error) {
			c.setStep("creating consumer %s on %s, which got no answer in time; trying again: %v", st.Consumer.Durable, stream, err)
		})
		if err != nil {
			return startErr(ctx, fmt.Errorf("consumer %s on %s: %w", st.Consumer.Durable, stream, err))
		}
		conses[i] = cons
	}
	if c.cfg.Prepare != nil {
		c.setStep("preparing")
		c.preparing.Store(true)
		err := c.cfg.Prepare(ctx)
		c.preparing.Store(false)
		if err != nil {
			return startErr(ctx, err)
		}
	}

	c.setStep("starting its admin service")
	ops, err := admin.Start(c.nc, c.cfg.Admin)
	if err != nil {
		return err
	}
	// The service's subscriptions reach the server before the process
	// says it is ready: whoever waits for Ready may call it at once.
	flushCtx, cancelFlush := context.WithTimeout(ctx, flushTimeout)
	err = c.nc.FlushWithContext(flushCtx)
	cancelFlush()
	if err != nil {
		c.stopAdmin(ops)
		return startErr(ctx, fmt.Errorf("flush the admin service's subscriptions: %w", err))
	}
	c.ready.Store(store)

	// The work runs on a context of its own: on shutdown it finishes what
	// the consumer handed it before the drain.
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var work sync.WaitGroup
	if c.cfg.Work != nil {
		work.Go(func() { c.cfg.Work(workCtx) })
	}
	var readers []*reader
	drain := func() {
		for _, r := range readers {
			r.stop()
		}
		for _, r := range readers {
			r.wait()
		}
	}
	for i, st := range streams {
		r, err := c.startReader(store.JetStream(), conses[i], st)
		if err != nil {
			c.setStep("stopping")
			c.ready.Store(nil)
			c.stopAdmin(ops)
			drain()
			stopWork()
			work.Wait()
			return fmt.Errorf("consume %s on %s: %w", st.Consumer.Durable, st.streamName(), err)
		}
		readers = append(readers, r)
	}
	c.log.Info(c.cfg.Name+" running", "bucket", c.cfg.Bucket, "stream", streams[0].streamName())

	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	var loops sync.WaitGroup
	for _, loop := range c.cfg.Loops {
		loops.Go(func() { loop(loopCtx) })
	}

	var failed error
	select {
	case <-ctx.Done():
	case failed = <-c.fatal:
	}
	c.setStep("stopping")
	c.ready.Store(nil)
	c.stopAdmin(ops)
	stopLoops()
	loops.Wait()
	drain()
	stopWork()
	work.Wait()
	if failed != nil {
		c.log.Error(c.cfg.Name+" stopped", "err", failed)
		return failed
	}
	c.log.Info(c.cfg.Name + " stopped")
	return nil
}

// stopAdmin stops the admin service, and logs it if that fails.
func (c *Consumer) stopAdmin(ops *admin.Server) {
	if err := ops.Stop(); err != nil {
		c.log.Error("stop admin service", "err", err)
	}
}

// flushTimeout bounds the wait for the server to have the admin
// service's subscriptions.
const flushTimeout = 10 * time.Second

// createConsumer creates or updates a durable consumer of stream,
// trying again while the server does not answer in time (see
// jsretry.Until), after pauses from retryFirst doubling to retryMost;
// each time, it tells unanswered (if set) the error.
func (c *Consumer) createConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, unanswered func(error)) (jetstream.Consumer, error) {
	return jsretry.Until(ctx, retryFirst, retryMost, func() (jetstream.Consumer, error) {
		return js.CreateOrUpdateConsumer(ctx, stream, cfg)
	}, func(err error, pause time.Duration) {
		if unanswered != nil {
			unanswered(err)
		}
		c.log.Warn("create the durable consumer: no answer in time; trying again", "consumer", cfg.Durable, "stream", stream, "err", err, "retry_in", pause)
	})
}

// openStore opens greendot's buckets, trying again while the server does
// not answer in time, as createConsumer does: a cluster that is starting
// may not for a while.
func (c *Consumer) openStore(ctx context.Context) (*presence.Store, error) {
	return jsretry.Until(ctx, retryFirst, retryMost, func() (*presence.Store, error) {
		return presence.Open(ctx, c.nc, c.cfg.Buckets)
	}, func(err error, pause time.Duration) {
		c.setStep("opening its buckets, which got no answer in time; trying again: %v", err)
		c.log.Warn("open the buckets: no answer in time; trying again", "err", err, "retry_in", pause)
	})
}

// startErr returns err, the reason a start failed, or nil when ctx was
// canceled: a process asked to stop while it starts has not failed.
func startErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
