package reaper_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"

	"github.com/greendot/greendot/internal/metricstest"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
)

// rig is a running reaper over an embedded NATS server, and a store that
// plays the gateway's part.
type rig struct {
	t     *testing.T
	srv   *server.Server
	store *presence.Store
	r     *reaper.Service
	stop  func()
}

func startRig(t *testing.T) *rig {
	t.Helper()
	srv := natstest.RunServer(t)
	ctx := context.Background()
	opts := presence.BucketOptions{MarkerTTL: time.Second}
	store, err := presence.Open(ctx, natstest.Connect(t, srv), opts)
	if err != nil {
		t.Fatal(err)
	}
	r, err := reaper.New(natstest.Connect(t, srv), reaper.Config{Buckets: opts, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ready(ctx); !errors.Is(err, reaper.ErrNotReady) {
		t.Fatalf("Ready before Run = %v, want ErrNotReady", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(patience):
			t.Errorf("reaper did not stop")
		}
	}
	t.Cleanup(stop)
	natstest.CheckFor(t, patience, 10*time.Millisecond, func() error { return r.Ready(ctx) })
	return &rig{t: t, srv: srv, store: store, r: r, stop: stop}
}

// connect does what a gateway does for a new connection: it creates the
// key with a TTL, then adds the connection to the user's record.
func (g *rig) connect(user, conn string, rec presence.ConnRecord, ttl time.Duration) {
	g.t.Helper()
	ctx := context.Background()
	rev, err := g.store.CreateConn(ctx, user, conn, rec, ttl)
	if err != nil {
		g.t.Fatal(err)
	}
	g.addToRecord(user, conn, rev)
}

func (g *rig) addToRecord(user, conn string, rev uint64) {
	g.t.Helper()
	if _, _, _, err := g.store.UpdateStatus(context.Background(), user, func(r *presence.Record) error {
		r.SetConn(conn, presence.ConnInfo{Gateway: "gw1", Since: time.Now().UnixMilli(), Rev: rev})
		return nil
	}); err != nil {
		g.t.Fatal(err)
	}
}

func (g *rig) awaitStatus(user string, want presence.Status) {
	g.t.Helper()
	natstest.CheckFor(g.t, patience, 10*time.Millisecond, func() error {
		rec, _, err := g.store.Status(context.Background(), user)
		if err != nil {
			return err
		}
		if rec.Status != want {
			return fmt.Errorf("%s is %s, want %s", user, rec.Status, want)
		}
		return nil
	})
}

// awaitMetric waits until the metric has at least want.
func (g *rig) awaitMetric(want float64, name string, labels ...string) {
	g.t.Helper()
	natstest.CheckFor(g.t, patience, 10*time.Millisecond, func() error {
		got, _ := metricstest.Value(g.r.Registry(), name, labels...)
		if got < want {
			return fmt.Errorf("%s%v = %v, want at least %v", name, labels, got, want)
		}
		return nil
	})
}

func (g *rig) metric(name string, labels ...string) float64 {
	v, _ := metricstest.Value(g.r.Registry(), name, labels...)
	return v
}

func TestMetricsOfRemovals(t *testing.T) {
	g := startRig(t)
	now := time.Now().UnixMilli()
	live := presence.ConnRecord{Gateway: "gw1", Since: now, ActiveAt: now, AwayAt: now + time.Hour.Milliseconds()}

	// A connection whose gateway stops refreshing it: its key expires.
	g.connect("alice", "c1", live, time.Second)
	g.awaitStatus("alice", presence.Online)
	g.awaitStatus("alice", presence.Offline)
	g.awaitMetric(1, "greendot_reaper_markers_total", "reason", "expired")
	g.awaitMetric(1, "greendot_reaper_transitions_total", "status", "offline")
	g.awaitMetric(1, "greendot_reaper_connections_removed_total", "source", "marker")
	g.awaitMetric(1, "greendot_reaper_reconciles_total", "kind", "marker", "result", "written")
	g.awaitMetric(1, "greendot_reaper_reconcile_seconds", "kind", "marker")
	g.awaitMetric(1, "greendot_reaper_marker_lag_seconds")

	// A dead connection whose gateway purges its key; bob keeps a second
	// connection, so he stays online: no transition.
	g.connect("bob", "c2", live, time.Minute)
	g.connect("bob", "c3", live, time.Minute)
	if err := g.store.PurgeConn(context.Background(), "bob", "c2"); err != nil {
		t.Fatal(err)
	}
	g.awaitMetric(1, "greendot_reaper_markers_total", "reason", "purged")
	g.awaitMetric(2, "greendot_reaper_connections_removed_total", "source", "marker")
	if got := g.metric("greendot_reaper_transitions_total", "status", "offline"); got != 1 {
		t.Errorf("offline transitions = %v, want 1: bob is still online on c3", got)
	}
	g.awaitStatus("bob", presence.Online)

	// A marker for a connection the record does not hold changes nothing.
	if _, err := g.store.CreateConn(context.Background(), "carol", "c9", live, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := g.store.PurgeConn(context.Background(), "carol", "c9"); err != nil {
		t.Fatal(err)
	}
	g.awaitMetric(1, "greendot_reaper_reconciles_total", "kind", "marker", "result", "unchanged")
}

func TestSweepEndpoint(t *testing.T) {
	g := startRig(t)
	ctx := context.Background()
	nc := natstest.Connect(t, g.srv)
	// The start-up sweep has run.
	g.awaitMetric(1, "greendot_reaper_sweeps_total", "result", "ok")

	// A record names a connection whose key is gone, and whose marker no
	// reaper will see: only a sweep repairs it.
	g.addToRecord("erin", "ghost", 1)
	g.awaitStatus("erin", presence.Online)

	reply, err := adminclient.Sweep(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Removed != 1 || reply.Instance == "" {
		t.Fatalf("sweep reply = %+v, want 1 removed", reply)
	}
	g.awaitStatus("erin", presence.Offline)
	if got := g.metric("greendot_reaper_connections_removed_total", "source", "sweep"); got != 1 {
		t.Errorf("sweep removals = %v, want 1", got)
	}
	if got := g.metric("greendot_reaper_transitions_total", "status", "offline"); got != 1 {
		t.Errorf("offline transitions = %v, want 1", got)
	}
	if got := g.metric("greendot_reaper_sweeps_total", "result", "ok"); got < 2 {
		t.Errorf("sweeps = %v, want at least 2", got)
	}

	// The info endpoint says who the reaper is, its configuration and load.
	infos, err := adminclient.GatherJSON[admin.Info](ctx, nc, admin.ReaperInfoSubject, nil, adminclient.GatherOptions{Want: 1, Timeout: 5 * time.Second})
	if err != nil || len(infos) != 1 {
		t.Fatalf("info = %+v, %v", infos, err)
	}
	in := infos[0]
	if in.Service != admin.ReaperService || in.Instance != reply.Instance || !in.Ready ||
		in.Config["sweep_interval"] != "1h0m0s" || in.Load["queued_tasks"] == nil {
		t.Fatalf("info = %+v", in)
	}

	g.stop()
	if err := g.r.Ready(ctx); !errors.Is(err, reaper.ErrNotReady) {
		t.Errorf("Ready after Run = %v, want ErrNotReady", err)
	}
	inst, err := adminclient.Instances(ctx, nc, admin.ReaperService, 300*time.Millisecond)
	if err != nil || len(inst) != 0 {
		t.Errorf("instances after stop = %v, %v, want none", inst, err)
	}
}

// TestOpsHTTP serves the reaper's registry and readiness the way
// --metrics-listen does.
func TestOpsHTTP(t *testing.T) {
	g := startRig(t)
	g.awaitMetric(1, "greendot_reaper_sweeps_total", "result", "ok")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: metrics.OpsHandler(g.r.Registry(), g.r.Ready), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	base := "http://" + ln.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/healthz = %d %s", code, body)
	}
	if code, body := get("/readyz"); code != 200 || !strings.Contains(body, "ready") {
		t.Errorf("/readyz = %d %s", code, body)
	}
	code, body := get("/metrics")
	for _, name := range []string{"greendot_reaper_sweeps_total", "greendot_reaper_lease_ends_total", "go_goroutines"} {
		if code != 200 || !strings.Contains(body, name) {
			t.Errorf("/metrics (%d) lacks %s", code, name)
		}
	}
	g.stop()
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "not ready") {
		t.Errorf("/readyz after stop = %d %s, want 503", code, body)
	}
}
