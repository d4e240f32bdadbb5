package system

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
)

// startSystem starts a system with an embedded NATS server; it is stopped
// when the test ends.
func startSystem(t *testing.T, nats NATSConfig) *System {
	t.Helper()
	if nats.StoreDir == "" {
		nats.StoreDir = t.TempDir()
	}
	sys, err := Start(Options{Name: "systemtest", NATS: &nats})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sys.Stop() })
	return sys
}

// listen returns a listener on a free loopback port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// fastGateway is a gateway configuration with dev auth and short timings.
func fastGateway() gateway.Config {
	return gateway.Config{DevAuth: true, ConnTTL: time.Second, HeartbeatInterval: 300 * time.Millisecond,
		OfflineGrace: time.Second, BatchInterval: 10 * time.Millisecond}
}

// get returns the status and body of GET url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// TestSystem runs a gateway, a reaper and a fanout on an embedded NATS
// server, has a client connect, serves every service's metrics from the
// gateway, and stops the system in order: the gateway first, then the
// reaper and fanout, then NATS.
func TestSystem(t *testing.T) {
	sys := startSystem(t, NATSConfig{})
	if u := sys.URL(); !strings.HasPrefix(u, "nats://127.0.0.1:") {
		t.Errorf("URL %q, want the embedded server's loopback address", u)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The buckets exist before the services start: nats-server races
	// when a stream is updated while a consumer is created on it.
	nc, err := sys.Connect("operator")
	if err != nil {
		t.Fatal(err)
	}
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rp, err := sys.StartReaper("reaper", reaper.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fo, err := sys.StartFanout("fanout", fanout.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastGateway()
	cfg.Metrics = sys.Gatherer()
	gw, err := sys.StartGateway("gateway", cfg, listen(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Proc{rp, fo, gw.Proc} {
		if err := p.AwaitReady(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := gw.Conn().Opts.Name, "systemtest gateway"; got != want {
		t.Errorf("gateway's connection is named %q, want %q", got, want)
	}
	if got := gw.Conn().ConnectedAddr(); !strings.HasPrefix(got, "127.0.0.1:") {
		t.Errorf("gateway connected to %q, want the server's listener", got)
	}

	c, err := client.Dial(ctx, gw.WS+"?user=alice", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Abort() }()
	checkFor(t, 30*time.Second, func() error {
		rec, _, err := store.Status(ctx, "alice")
		if err != nil {
			return err
		}
		if rec.Status != presence.Online {
			return errors.New("alice is " + string(rec.Status))
		}
		return nil
	})

	code, body := get(t, gw.HTTP+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d %s", code, body)
	}
	for _, want := range []string{"greendot_gateway_", "greendot_reaper_", "greendot_fanout_"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %s* metric", want)
		}
	}
	if n := strings.Count(body, "# TYPE go_goroutines "); n != 1 {
		t.Errorf("/metrics has go_goroutines %d times, want once", n)
	}

	// When a reaper or fanout has returned, the gateway has already.
	stoppedFirst := make(chan bool, 2)
	for _, p := range []*Proc{rp, fo} {
		go func() {
			<-p.Done()
			stoppedFirst <- closed(gw.done)
		}()
	}
	if err := sys.Stop(); err != nil {
		t.Errorf("Stop = %v", err)
	}
	for range 2 {
		if !<-stoppedFirst {
			t.Error("a reaper or fanout stopped before the gateway")
		}
	}
	for _, p := range []*Proc{rp, fo, gw.Proc} {
		if !closed(p.done) || p.Err() != nil || !nc.IsClosed() {
			t.Errorf("%s after Stop: returned %v, err %v; operator connection closed %v", p.Name(), closed(p.done), p.Err(), nc.IsClosed())
		}
	}
	if sys.NATS().Running() {
		t.Error("the NATS server runs after Stop")
	}
	if _, err := sys.StartReaper("late", reaper.Config{}); err == nil {
		t.Error("a reaper started after Stop")
	}
}

// TestSystemServiceFails reports a service that ends by itself: Exited is
// closed, AwaitReady says it stopped, and Stop returns its error.
func TestSystemServiceFails(t *testing.T) {
	sys := startSystem(t, NATSConfig{})
	cfg := fastGateway()
	// Three replicas cannot be placed on one server: the gateway cannot
	// create its buckets, and returns.
	cfg.Buckets = presence.BucketOptions{Replicas: 3}
	gw, err := sys.StartGateway("gateway", cfg, listen(t))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sys.Exited():
	case <-time.After(time.Minute):
		t.Fatal("Exited not closed after the gateway failed")
	}
	if err := gw.AwaitReady(context.Background(), time.Minute); !errors.Is(err, ErrStopped) {
		t.Errorf("AwaitReady = %v, want ErrStopped", err)
	}
	if gw.Err() == nil {
		t.Error("Err = nil after a failure")
	}
	if err := sys.Stop(); err == nil || !strings.HasPrefix(err.Error(), "gateway: ") {
		t.Errorf("Stop = %v, want the gateway's error", err)
	}
}

// TestSystemReady reports the readiness of every part of a system, as a
// gateway's GET /readyz does when it is the system's: ready once all are,
// then the reaper named once it stops, then the NATS server once it
// disables JetStream, as it does on a storage failure, ahead of any
// service.
func TestSystemReady(t *testing.T) {
	sys := startSystem(t, NATSConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := sys.Connect("operator")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := presence.Open(ctx, nc, presence.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	rp, err := sys.StartReaper("reaper", reaper.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastGateway()
	cfg.Readyz = sys.Ready
	gw, err := sys.StartGateway("gateway", cfg, listen(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.AwaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, gw.HTTP+"/readyz"); code != http.StatusOK || body != `{"status":"ready"}`+"\n" {
		t.Errorf("GET /readyz of a ready system = %d %s", code, body)
	}

	// notReady checks that Ready names part, with its own reason (which
	// starts with reason), and that GET /readyz answers 503 with both.
	notReady := func(part, reason string) {
		t.Helper()
		err := sys.Ready(ctx)
		pe, ok := err.(*metrics.PartNotReady)
		if !ok || pe.Part != part || !strings.HasPrefix(pe.Err.Error(), reason) {
			t.Fatalf("Ready = %v, want %s named, not ready with %q", err, part, reason)
		}
		want := `{"error":"` + pe.Err.Error() + `","part":"` + part + `","status":"unavailable"}` + "\n"
		if code, body := get(t, gw.HTTP+"/readyz"); code != http.StatusServiceUnavailable || body != want {
			t.Errorf("GET /readyz = %d %s, want 503 %s", code, body, want)
		}
	}
	if err := rp.Stop(0); err != nil {
		t.Fatal(err)
	}
	notReady("reaper", reaper.ErrNotReady.Error())
	if err := sys.AwaitReady(ctx, time.Minute); !errors.Is(err, ErrStopped) {
		t.Errorf("AwaitReady with the reaper stopped = %v, want ErrStopped", err)
	}
	if err := sys.NATS().DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	notReady("nats", "JetStream not enabled")
}

// TestSystemStopsChildrenInOrder stops a gateway child process before any
// other, then the NATS server.
func TestSystemStopsChildrenInOrder(t *testing.T) {
	sys := startSystem(t, NATSConfig{InProcessOnly: true})
	if u := sys.URL(); u != "" {
		t.Errorf("URL %q with no listener, want none", u)
	}
	gwOpts := helperOptions(t, "gateway", "wait")
	gwOpts.Kind = KindGateway
	gwc, err := sys.StartChild(gwOpts)
	if err != nil {
		t.Fatal(err)
	}
	other, err := sys.StartChild(helperOptions(t, "other", "wait"))
	if err != nil {
		t.Fatal(err)
	}
	awaitLine(t, gwc, "waiting")
	awaitLine(t, other, "waiting")
	// Connections of a system without a listener are in-process.
	nc, err := sys.Connect("operator")
	if err != nil {
		t.Fatal(err)
	}
	if got := nc.ConnectedAddr(); got != "pipe" {
		t.Errorf("connected to %q, want an in-process pipe", got)
	}
	if _, err := presence.Open(context.Background(), nc, presence.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	stoppedFirst := make(chan bool, 1)
	go func() {
		<-other.Done()
		stoppedFirst <- closed(gwc.done)
	}()
	if err := sys.Stop(); err != nil {
		t.Errorf("Stop = %v", err)
	}
	if !<-stoppedFirst {
		t.Error("the other child stopped before the gateway")
	}
	select {
	case <-sys.Exited():
		t.Error("Exited closed by the children Stop ended")
	default:
	}
}

// TestSystemChildExits closes Exited when a child ends by itself.
func TestSystemChildExits(t *testing.T) {
	sys := startSystem(t, NATSConfig{InProcessOnly: true})
	o := helperOptions(t, "failing", "fail")
	o.StopSignal = syscall.SIGKILL
	if _, err := sys.StartChild(o); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sys.Exited():
	case <-time.After(time.Minute):
		t.Fatal("Exited not closed after the child failed")
	}
	if err := sys.Stop(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Stop = %v, want the child's exit status", err)
	}
}

// TestStartNATS starts embedded servers as every user of the package does.
func TestStartNATS(t *testing.T) {
	logWriter, logged := capture()
	tests := []struct {
		name    string
		cfg     NATSConfig
		wantErr string
		check   func(t *testing.T, srv *server.Server)
	}{
		{
			name: "defaults",
			cfg:  NATSConfig{Logger: slog.New(slog.NewTextHandler(logWriter, &slog.HandlerOptions{Level: slog.LevelDebug}))},
			check: func(t *testing.T, srv *server.Server) {
				if !strings.HasPrefix(srv.ClientURL(), "nats://127.0.0.1:") {
					t.Errorf("ClientURL %q, want loopback", srv.ClientURL())
				}
				if log := logged(); !strings.Contains(log, "level=DEBUG msg=\"Server is ready\" svc=nats") {
					t.Errorf("the server's notices are not in the log at debug level:\n%s", log)
				}
			},
		},
		{
			name: "from options",
			cfg: NATSConfig{Options: &server.Options{ServerName: "loaded", Host: "127.0.0.1", Port: server.RANDOM_PORT},
				Name: "renamed", MaxPending: 1 << 20},
			check: func(t *testing.T, srv *server.Server) {
				if srv.Name() != "renamed" {
					t.Errorf("name %q, want renamed", srv.Name())
				}
				if got := srv.ClientURL(); strings.HasSuffix(got, ":-1") || strings.HasSuffix(got, ":4222") {
					t.Errorf("ClientURL %q, want a random port", got)
				}
			},
		},
		{
			name: "in-process only",
			cfg:  NATSConfig{InProcessOnly: true, Host: "127.0.0.1", Port: 4222},
			check: func(t *testing.T, srv *server.Server) {
				if srv.Addr() != nil {
					t.Errorf("listens on %v", srv.Addr())
				}
				nc, err := nats.Connect("", nats.InProcessServer(srv))
				if err != nil {
					t.Fatal(err)
				}
				nc.Close()
			},
		},
		{
			name:    "no store",
			cfg:     NATSConfig{StoreDir: "-"},
			wantErr: "no JetStream store directory",
		},
		{
			name:    "port in use",
			wantErr: "nats server: Error listening on port",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			switch cfg.StoreDir {
			case "":
				cfg.StoreDir = t.TempDir()
			case "-":
				cfg.StoreDir = ""
			}
			if tt.name == "port in use" {
				ln := listen(t)
				defer func() { _ = ln.Close() }()
				cfg.Port = ln.Addr().(*net.TCPAddr).Port
			}
			start := time.Now()
			srv, err := StartNATS(cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("StartNATS = %v, want %q", err, tt.wantErr)
				}
				// The listener's error is in it, for the command to name its flag.
				if op := (*net.OpError)(nil); tt.name == "port in use" && (!errors.As(err, &op) || op.Op != "listen") {
					t.Errorf("StartNATS = %v, want it to wrap the *net.OpError of the listen", err)
				}
				if d := time.Since(start); d > 20*time.Second {
					t.Errorf("the failure took %v", d)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				srv.Shutdown()
				srv.WaitForShutdown()
			}()
			if !srv.JetStreamEnabled() {
				t.Error("JetStream is off")
			}
			tt.check(t, srv)
		})
	}
}

// TestAwaitReadyTimeout returns, after its timeout, an error that wraps
// ErrTimeout and the last readiness error, so that a caller can name the
// part that is not ready.
func TestAwaitReadyTimeout(t *testing.T) {
	errNotReady := errors.New("reaper: not ready")
	err := awaitReady(context.Background(), 50*time.Millisecond, "test", func(context.Context) error {
		return &metrics.PartNotReady{Part: "reaper", Err: errNotReady}
	}, nil)
	var p *metrics.PartNotReady
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &p) || p.Part != "reaper" || !errors.Is(err, errNotReady) {
		t.Fatalf("awaitReady = %v, want ErrTimeout and the reaper's readiness error", err)
	}
	if want := "test not ready after 50ms: timed out: reaper: reaper: not ready"; err.Error() != want {
		t.Errorf("awaitReady = %q, want %q", err, want)
	}
}
