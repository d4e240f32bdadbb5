package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"

	"github.com/greendot/greendot/internal/metricstest"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/presence"
)

func TestMetrics(t *testing.T) {
	srv := natstest.RunServer(t)
	ctx := context.Background()
	nc := natstest.Connect(t, srv)
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := fanout.New(natstest.Connect(t, srv), fanout.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Ready(ctx); !errors.Is(err, fanout.ErrNotReady) {
		t.Fatalf("Ready before Run = %v, want ErrNotReady", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return f.Ready(ctx) })

	events, err := nc.SubscribeSync(presence.EventWildcard)
	if err != nil {
		t.Fatal(err)
	}
	selfs, err := nc.SubscribeSync(presence.SelfSubject("gw1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	value := func(name string, labels ...string) float64 {
		v, _ := metricstest.Value(f.Registry(), name, labels...)
		return v
	}
	await := func(want float64, name string, labels ...string) {
		t.Helper()
		natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if got := value(name, labels...); got != want {
				return fmt.Errorf("%s%v = %v, want %v", name, labels, got, want)
			}
			return nil
		})
	}
	next := func(sub *nats.Subscription) *nats.Msg {
		t.Helper()
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("%s: %v", sub.Subject, err)
		}
		return m
	}
	setConns := func(n int) {
		t.Helper()
		if _, _, _, err := store.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
			r.Conns = nil
			for i := range n {
				r.SetConn(fmt.Sprintf("c%d", i), presence.ConnInfo{Gateway: "gw1", Since: 1, Rev: uint64(i + 1)})
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	// alice comes online: a public event and a self event.
	setConns(1)
	next(events)
	next(selfs)
	await(1, "greendot_fanout_revisions_total")
	await(1, "greendot_fanout_events_published_total")
	await(1, "greendot_fanout_self_events_published_total")
	await(1, "greendot_fanout_lag_seconds")
	await(1, "greendot_fanout_cached_users")

	// A second device changes nothing others see: suppressed, but her own
	// devices learn the new count.
	setConns(2)
	next(selfs)
	await(2, "greendot_fanout_revisions_total")
	await(1, "greendot_fanout_events_suppressed_total")
	await(1, "greendot_fanout_events_published_total")
	await(2, "greendot_fanout_self_events_published_total")

	// Records that are not greendot's are acknowledged and counted.
	js := store.JetStream()
	if _, err := js.Publish(ctx, presence.KeySubject(presence.StatusBucket, "not_json"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, presence.KeySubject(presence.StatusBucket, "a.b"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	await(1, "greendot_fanout_revisions_ignored_total", "reason", "undecodable")
	await(1, "greendot_fanout_revisions_ignored_total", "reason", "invalid_key")
	await(4, "greendot_fanout_revisions_total")
	// One whose versions read, and the rest not: the versions alone
	// say it calls for events, which the record cannot make. Its
	// versions are remembered (cached_users is 2: alice and half_json).
	if _, err := js.Publish(ctx, presence.KeySubject(presence.StatusBucket, "half_json"), []byte(`{"pv":1,"sv":1,"conns":5}`)); err != nil {
		t.Fatal(err)
	}
	await(2, "greendot_fanout_revisions_ignored_total", "reason", "undecodable")
	await(5, "greendot_fanout_revisions_total")
	if got, got2 := value("greendot_fanout_events_published_total"), value("greendot_fanout_self_events_published_total"); got != 1 || got2 != 2 {
		t.Errorf("events published = %v and %v self, want 1 and 2: nothing of the undecodable record", got, got2)
	}
	if got := value("greendot_fanout_revisions_failed_total"); got != 0 {
		t.Errorf("failed = %v, want 0", got)
	}

	// The info endpoint.
	infos, err := adminclient.GatherJSON[admin.Info](ctx, nc, admin.FanoutInfoSubject, nil, adminclient.GatherOptions{Want: 1, Timeout: 5 * time.Second})
	if err != nil || len(infos) != 1 {
		t.Fatalf("info = %+v, %v", infos, err)
	}
	if in := infos[0]; in.Service != admin.FanoutService || !in.Ready || in.Load["cached_users"] != float64(2) || in.Config["consumer"] != presence.FanoutConsumer {
		t.Fatalf("info = %+v", in)
	}
}
