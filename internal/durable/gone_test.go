package durable_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/durable"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// goneRig is a running Consumer of testConfig's, and the JetStream of
// another connection, an operator's.
type goneRig struct {
	t       *testing.T
	c       *durable.Consumer
	nc      *nats.Conn // the Consumer's
	js      jetstream.JetStream
	store   *presence.Store
	handled chan string
}

// readModes are the two ways a Consumer reads: Consume, and batches.
var readModes = []struct {
	name      string
	pullEvery time.Duration
}{{"consume", 0}, {"batches", 20 * time.Millisecond}}

// startGone runs a Consumer reading as pullEvery says, over a connection
// made with opts, until the test ends, and waits until it is ready.
func startGone(t *testing.T, srv *server.Server, pullEvery time.Duration, opts ...nats.Option) *goneRig {
	t.Helper()
	ctx := context.Background()
	g := &goneRig{t: t, nc: natstest.Connect(t, srv, opts...), handled: make(chan string, 10)}
	store, err := presence.Open(ctx, natstest.Connect(t, srv), presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g.store, g.js = store, store.JetStream()
	var j journal
	cfg := testConfig(&j, g.handled)
	cfg.PullEvery = pullEvery
	if g.c, err = durable.New(g.nc, cfg); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.c.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		awaitRun(t, done, 30*time.Second)
	})
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return g.c.Ready(ctx) })
	return g
}

var statusStream = presence.StreamName(presence.StatusBucket)

// deleteConsumer does what `nats consumer rm` does.
func (g *goneRig) deleteConsumer(name string) {
	g.t.Helper()
	if err := g.js.DeleteConsumer(context.Background(), statusStream, name); err != nil {
		g.t.Fatal(err)
	}
}

// awaitConsuming waits until the Consumer is ready and hands a record
// written now to its handler.
func (g *goneRig) awaitConsuming(user string) {
	g.t.Helper()
	ctx := context.Background()
	natstest.CheckFor(g.t, 20*time.Second, 10*time.Millisecond, func() error { return g.c.Ready(ctx) })
	if _, _, _, err := g.store.UpdateStatus(ctx, user, func(r *presence.Record) error {
		r.SetConn("c1", presence.ConnInfo{Gateway: "gw1"})
		return nil
	}); err != nil {
		g.t.Fatal(err)
	}
	want := presence.KeySubject(presence.StatusBucket, user)
	deadline := time.After(20 * time.Second)
	for {
		select {
		case subject := <-g.handled:
			if subject == want {
				return
			}
		case <-deadline:
			g.t.Fatalf("%s's record not handled within 20s of its write", user)
		}
	}
}

// TestConsumerDeletedIsCreatedAgain: the durable consumer is deleted (an
// operator's `nats consumer rm`) while the process runs. nats.go ends a
// Consume for good on it, and a fetch fails for as long as the consumer is
// missing: the process creates it again, and goes on handling messages.
func TestConsumerDeletedIsCreatedAgain(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			srv := natstest.RunServer(t)
			g := startGone(t, srv, mode.pullEvery)
			g.awaitConsuming("alice")
			g.deleteConsumer("durable-test")
			g.awaitConsuming("bob")
		})
	}
}

// TestConsumerDeletedWhileAway: the consumer is deleted while the
// process's connection is away, so it never hears of the deletion; back,
// it only hears that nobody answers its requests. It creates the consumer
// again.
func TestConsumerDeletedWhileAway(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			srv := natstest.RunServer(t)
			var d dialer
			g := startGone(t, srv, mode.pullEvery, nats.SetCustomDialer(&d))
			g.awaitConsuming("alice")

			d.blocked.Store(true)
			if err := g.nc.ForceReconnect(); err != nil {
				t.Fatal(err)
			}
			natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
				if g.nc.IsConnected() {
					return errors.New("still connected")
				}
				return nil
			})
			g.deleteConsumer("durable-test")
			d.blocked.Store(false)
			g.awaitConsuming("bob")
		})
	}
}

// dialer dials NATS unless blocked.
type dialer struct{ blocked atomic.Bool }

func (d *dialer) Dial(network, address string) (net.Conn, error) {
	if d.blocked.Load() {
		return nil, errors.New("test: NATS unreachable")
	}
	return net.Dial(network, address)
}

// TestNotReadyWhileConsumerMissing: a consumer deleted that cannot be
// created again (its stream allows no more consumers) leaves the process
// not ready, with the consumer named, until it can; then it consumes
// again.
func TestNotReadyWhileConsumerMissing(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			srv := natstest.RunServer(t)
			g := startGone(t, srv, mode.pullEvery)
			ctx := context.Background()

			// Another consumer takes the only place left.
			if _, err := g.js.CreateOrUpdateConsumer(ctx, statusStream, jetstream.ConsumerConfig{Durable: "other"}); err != nil {
				t.Fatal(err)
			}
			st, err := g.js.Stream(ctx, statusStream)
			if err != nil {
				t.Fatal(err)
			}
			cfg := st.CachedInfo().Config
			cfg.MaxConsumers = 1
			if _, err := g.js.UpdateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			g.deleteConsumer("durable-test")
			natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
				err := g.c.Ready(ctx)
				if !errors.Is(err, errTestNotReady) || !strings.Contains(err.Error(), "durable-test") ||
					!strings.Contains(err.Error(), "maximum consumers limit reached") {
					return fmt.Errorf("Ready = %v, want the configured NotReady naming the missing consumer and why it cannot be created", err)
				}
				return nil
			})

			g.deleteConsumer("other")
			g.awaitConsuming("alice")
		})
	}
}

// TestStopsWhenBucketsReplaced: the bucket consumed is deleted and created
// again (NATS came back without its storage, or an operator replaced it)
// while the process runs. Its consumer is gone with it, and rather than
// create it on the new bucket, whose revisions started again, the process
// stops as it does when canceled and Run returns an error that wraps
// presence.ErrStoreReplaced.
func TestStopsWhenBucketsReplaced(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			srv := natstest.RunServer(t)
			ctx := context.Background()
			operator, err := presence.Open(ctx, natstest.Connect(t, srv), presence.BucketOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var j journal
			cfg := testConfig(&j, make(chan string, 100))
			cfg.PullEvery = mode.pullEvery
			c, err := durable.New(natstest.Connect(t, srv), cfg)
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()
			natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return c.Ready(ctx) })

			js := operator.JetStream()
			if err := js.DeleteKeyValue(ctx, presence.StatusBucket); err != nil {
				t.Fatal(err)
			}
			if _, err := presence.EnsureBucket(ctx, js, presence.StatusBucket, presence.BucketOptions{}); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if !errors.Is(err, presence.ErrStoreReplaced) {
					t.Fatalf("Run = %v, want %v", err, presence.ErrStoreReplaced)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return within 30s of the bucket's replacement")
			}
			if !j.has("work stopped") {
				t.Errorf("journal %v: the work was not stopped", j.list())
			}
		})
	}
}
