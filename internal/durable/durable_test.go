package durable_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/internal/durable"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/presence"
)

// journal records the steps of a Consumer's life in order.
type journal struct {
	mu    sync.Mutex
	steps []string
}

func (j *journal) add(step string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.steps = append(j.steps, step)
}

func (j *journal) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.steps)
}

func (j *journal) has(step string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Contains(j.steps, step)
}

func (j *journal) index(step string) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Index(j.steps, step)
}

var errTestNotReady = errors.New("test: not ready")

// awaitRun waits up to within for a canceled Run to return, and checks
// that it returned nil.
func awaitRun(t *testing.T, done <-chan error, within time.Duration) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(within):
		t.Fatalf("Run did not return within %v of its cancellation", within)
	}
}

func testConfig(j *journal, handled chan<- string) durable.Config {
	return durable.Config{
		Name:   "test",
		Bucket: presence.StatusBucket,
		Consumer: jetstream.ConsumerConfig{
			Durable:       "durable-test",
			FilterSubject: presence.KeySubject(presence.StatusBucket, ">"),
			AckPolicy:     jetstream.AckExplicitPolicy,
		},
		Admin: admin.ServiceConfig{
			Name:        "greendot-durable-test",
			InfoSubject: "greendot.durable-test.info",
		},
		NotReady: errTestNotReady,
		Opened:   func(*presence.Store) { j.add("opened") },
		Work: func(ctx context.Context) {
			j.add("work started")
			<-ctx.Done()
			j.add("work stopped")
		},
		Handle: func(msg jetstream.Msg) {
			_ = msg.Ack()
			handled <- msg.Subject()
		},
		Loops: []func(context.Context){func(ctx context.Context) {
			j.add("loop started")
			<-ctx.Done()
			j.add("loop stopped")
		}},
	}
}

// TestLifecycle runs a Consumer through its whole life: not ready before
// Run, ready with its admin service and consuming while it runs, and on
// cancellation every goroutine it started has returned, loops before the
// work, when Run returns.
func TestLifecycle(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx := context.Background()
	var j journal
	handled := make(chan string, 10)
	cfg := testConfig(&j, handled)
	var logs bytes.Buffer // written by Run, read once it has returned
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	c, err := durable.New(natstest.Connect(t, srv), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(ctx); !errors.Is(err, errTestNotReady) {
		t.Fatalf("Ready before Run = %v, want the configured NotReady", err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return c.Ready(ctx) })
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if !j.has("loop started") || !j.has("work started") {
			return fmt.Errorf("steps so far: %v", j.list())
		}
		return nil
	})
	if !j.has("opened") {
		t.Errorf("ready without Opened having been called: %v", j.list())
	}

	// The admin service answers, and says it is ready.
	infos, err := adminclient.GatherJSON[admin.Info](ctx, nc, "greendot.durable-test.info", nil,
		adminclient.GatherOptions{Want: 1, Timeout: 10 * time.Second})
	if err != nil || len(infos) != 1 || !infos[0].Ready {
		t.Fatalf("info = %+v, %v; want one ready instance", infos, err)
	}

	// A message of the bucket's stream reaches Handle.
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := store.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
		r.SetConn("a1", presence.ConnInfo{Gateway: "gw1"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case subject := <-handled:
		if subject != presence.KeySubject(presence.StatusBucket, "alice") {
			t.Errorf("handled %s, want alice's record", subject)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no message handled within 20s")
	}

	cancel()
	awaitRun(t, done, 30*time.Second)
	if !j.has("loop stopped") || !j.has("work stopped") {
		t.Fatalf("Run returned before its goroutines did: %v", j.list())
	}
	// Tools wait for this line to know that a process consumes.
	if want := `"msg":"test running","bucket":"` + presence.StatusBucket + `"`; !strings.Contains(logs.String(), want) {
		t.Errorf("logs lack %s:\n%s", want, logs.String())
	}
	// And this one to know that it stopped cleanly, its work done.
	if want := `"msg":"test stopped"`; !strings.Contains(logs.String(), want) {
		t.Errorf("logs lack %s:\n%s", want, logs.String())
	}
	if j.index("loop stopped") > j.index("work stopped") {
		t.Errorf("work stopped before the loops: %v", j.list())
	}
	if err := c.Ready(ctx); !errors.Is(err, errTestNotReady) || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("Ready after Run = %v, want the configured NotReady, saying it stopped", err)
	}
	inst, err := adminclient.Instances(ctx, nc, "greendot-durable-test", 300*time.Millisecond)
	if err != nil || len(inst) != 0 {
		t.Errorf("admin instances after Run = %v, %v; want none", inst, err)
	}
}

// TestCanceledStart: a Run canceled before it could start returns nil and
// starts nothing.
func TestCanceledStart(t *testing.T) {
	srv := natstest.RunServer(t)
	var j journal
	c, err := durable.New(natstest.Connect(t, srv), testConfig(&j, make(chan string, 1)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Run(ctx); err != nil {
		t.Errorf("Run with a canceled context = %v, want nil", err)
	}
	if j.has("work started") || j.has("loop started") {
		t.Errorf("a canceled start started goroutines: %v", j.list())
	}
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	full := testConfig(&journal{}, nil)
	tests := []struct {
		name   string
		change func(*durable.Config)
	}{
		{"no name", func(c *durable.Config) { c.Name = "" }},
		{"no bucket", func(c *durable.Config) { c.Bucket = "" }},
		{"no durable name", func(c *durable.Config) { c.Consumer.Durable = "" }},
		{"no admin service", func(c *durable.Config) { c.Admin.Name = "" }},
		{"no handler", func(c *durable.Config) { c.Handle = nil }},
		{"negative pull", func(c *durable.Config) { c.PullMaxMessages = -1 }},
		{"negative pull period", func(c *durable.Config) { c.PullEvery = -time.Second }},
		{"pull period with pull options", func(c *durable.Config) {
			c.PullEvery = time.Second
			c.PullOptions = []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(5)}
		}},
		{"negative pull period of another consumer", func(c *durable.Config) {
			c.More = []durable.Stream{{Bucket: presence.StatusBucket, Consumer: jetstream.ConsumerConfig{Durable: "more"}, Handle: func(jetstream.Msg) {}, PullEvery: -1}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := full
			tt.change(&cfg)
			if _, err := durable.New(nil, cfg); !errors.Is(err, durable.ErrInvalidConfig) {
				t.Errorf("got %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// TestPrepareBeforeReady: the process is not ready while its preparation
// runs, and says so, with the preparation's progress when it tells it;
// a preparation that fails ends Run with its error, with nothing started.
func TestPrepareBeforeReady(t *testing.T) {
	srv := natstest.RunServer(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		preparing func() string
		want      string
	}{
		{"silent", nil, "test: not ready: preparing"},
		{"silent for now", func() string { return "" }, "test: not ready: preparing"},
		{"telling", func() string { return "12 records read" }, "test: not ready: 12 records read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var j journal
			cfg := testConfig(&j, make(chan string, 10))
			entered, release := make(chan struct{}), make(chan struct{})
			cfg.Prepare = func(context.Context) error {
				close(entered)
				<-release
				return nil
			}
			cfg.Preparing = tc.preparing
			c, err := durable.New(natstest.Connect(t, srv), cfg)
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()
			select {
			case <-entered:
			case <-time.After(20 * time.Second):
				t.Fatal("Prepare not called within 20s")
			}
			if err := c.Ready(ctx); !errors.Is(err, errTestNotReady) || err.Error() != tc.want {
				t.Errorf("Ready while preparing = %v, want the configured NotReady: %q", err, tc.want)
			}
			close(release)
			natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return c.Ready(ctx) })
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
		})
	}

	failure := errors.New("cannot prepare")
	var j2 journal
	cfg := testConfig(&j2, make(chan string, 10))
	cfg.Prepare = func(context.Context) error { return failure }
	c, err := durable.New(natstest.Connect(t, srv), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx); !errors.Is(err, failure) {
		t.Errorf("Run with a failing Prepare = %v, want its error", err)
	}
	if j2.has("work started") || j2.has("loop started") {
		t.Errorf("a failed preparation started goroutines: %v", j2.list())
	}
}

// TestPullEvery: a consumer read in batches hands every message to Handle
// once and in order, more than a batch holds as well as one written after a
// quiet spell (which a waiting request takes), and a Run canceled while
// that request waits returns at once, not when it expires.
func TestPullEvery(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx := context.Background()
	var j journal
	handled := make(chan string, 100)
	cfg := testConfig(&j, handled)
	cfg.PullEvery = 20 * time.Millisecond
	cfg.PullMaxMessages = 10
	c, err := durable.New(natstest.Connect(t, srv), cfg)
	if err != nil {
		t.Fatal(err)
	}
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	write := func(user string) {
		t.Helper()
		if _, _, _, err := store.UpdateStatus(ctx, user, func(r *presence.Record) error {
			r.SetConn("c1", presence.ConnInfo{Gateway: "gw1"})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(users ...string) {
		t.Helper()
		for _, u := range users {
			select {
			case subject := <-handled:
				if want := presence.KeySubject(presence.StatusBucket, u); subject != want {
					t.Fatalf("handled %s, want %s", subject, want)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%s not handled within 20s", u)
			}
		}
	}

	// waiting reports whether a request of the reader waits on the server.
	waiting := func() error {
		info, err := store.JetStream().Consumer(ctx, presence.StreamName(presence.StatusBucket), "durable-test")
		if err != nil {
			return err
		}
		if info.CachedInfo().NumWaiting == 0 {
			return errors.New("no request waits")
		}
		return nil
	}

	// Written before Run: 25 wait, more than a batch of 10.
	var users []string
	for i := range 25 {
		users = append(users, fmt.Sprintf("u%02d", i))
		write(users[i])
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	expect(users...)

	// Nothing waits now: the reader waits for the next message.
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, waiting)
	write("late")
	expect("late")
	select {
	case subject := <-handled:
		t.Fatalf("handled %s again", subject)
	default:
	}

	// Canceled while a request waits: Run returns long before it expires.
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, waiting)
	start := time.Now()
	cancel()
	awaitRun(t, done, 20*time.Second)
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("Run took %v to return: it waited for the request to expire", d)
	}
}
