package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/greendot/greendot/internal/freeport"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system"
)

// readyTimeout bounds the wait for a started process to be ready.
const readyTimeout = 60 * time.Second

// stopTimeout bounds the wait for a signaled process to exit.
const stopTimeout = 60 * time.Second

// sut is the greendot system under test: processes this run started, or
// addresses of an existing deployment.
type sut struct {
	cfg *Config
	log *slog.Logger
	sys *system.System // the NATS server and the processes this run started
	// store writes the follow graph.
	store    *presence.Store
	gateways []*gateway
	others   []*system.Child // reaper and fanout
}

// gateway is one gateway of the system.
type gateway struct {
	n    int
	ws   string        // ws://host:port/ws
	http string        // http://host:port
	addr string        // host:port
	proc *system.Child // nil for an existing gateway
}

// childEnv is the environment of the processes the bench starts: its own,
// without the GREENDOT_ variables, so that only the bench's flags configure
// the system under test.
func childEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GREENDOT_") })
}

// startSystem starts what the configuration asks for, its files in dir: an
// embedded NATS server unless NATSURL is set, gateways (unless GatewayURLs
// are given), a reaper and a fanout.
func startSystem(ctx context.Context, cfg *Config, log *slog.Logger, dir string) (s *sut, err error) {
	opts := system.Options{Name: "greendot-bench", URL: cfg.NATSURL, Logger: log, StopTimeout: stopTimeout}
	if cfg.NATSURL == "" {
		opts.NATS = &system.NATSConfig{
			StoreDir: filepath.Join(dir, "nats"),
			// One connection per process kind and worker, but the
			// gateways' subscriptions and pending acks can be many.
			MaxPending: 256 << 20,
			Logger:     slog.New(slog.DiscardHandler),
		}
	}
	sys, err := system.Start(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSystem, err)
	}
	s = &sut{cfg: cfg, log: log, sys: sys}
	started := s // s itself is nil by the time a failure's defer runs
	defer func() {
		if err != nil {
			started.stop()
		}
	}()
	nc, err := sys.Connect("graph")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSystem, err)
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	s.store, err = presence.Open(octx, nc, presence.BucketOptions{})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%w: open buckets: %v", ErrSystem, err)
	}
	if len(cfg.GatewayURLs) > 0 {
		for i, u := range cfg.GatewayURLs {
			g, err := parseGatewayURL(u)
			if err != nil {
				return nil, err
			}
			g.n = i
			s.gateways = append(s.gateways, g)
		}
		return s, nil
	}
	for _, kind := range []system.Kind{system.KindReaper, system.KindFanout} {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		c, err := s.start(system.ChildOptions{
			Name: kind.String(),
			Kind: kind,
			Args: []string{kind.String(), "--nats-url", sys.URL(), "--metrics-listen", addr, "--log-level", "warn"},
			Log:  filepath.Join(dir, kind.String()+".log"),
		})
		if err != nil {
			return nil, err
		}
		s.others = append(s.others, c)
		if err := awaitReady(ctx, c, "http://"+addr); err != nil {
			return nil, err
		}
	}
	for i := range cfg.Gateways {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		g := &gateway{n: i, addr: addr, ws: "ws://" + addr + "/ws", http: "http://" + addr}
		// At the end, gateways are killed: their keys are thrown away with
		// the NATS server.
		g.proc, err = s.start(system.ChildOptions{
			Name:       fmt.Sprintf("gateway %d", i),
			Kind:       system.KindGateway,
			StopSignal: syscall.SIGKILL,
			Args:       s.gatewayArgs(i, addr),
			Log:        filepath.Join(dir, fmt.Sprintf("gateway-%d.log", i)),
		}, cfg.GatewayEnv...)
		if err != nil {
			return nil, err
		}
		s.gateways = append(s.gateways, g)
	}
	for _, g := range s.gateways {
		if err := awaitReady(ctx, g.proc, g.http); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// start starts a process of the greendot binary, with env (NAME=VALUE)
// added to its environment.
func (s *sut) start(o system.ChildOptions, env ...string) (*system.Child, error) {
	o.Path, o.Env = s.cfg.Greendot, append(childEnv(), env...)
	c, err := s.sys.StartChild(o)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSystem, err)
	}
	return c, nil
}

// embedded reports whether the NATS server runs in this process.
func (s *sut) embedded() bool { return s.sys.NATS() != nil }

// gatewayArgs returns the command line of gateway n.
func (s *sut) gatewayArgs(n int, addr string) []string {
	cfg := s.cfg
	args := []string{"gateway", "--listen", addr, "--nats-url", s.sys.URL(), "--dev-auth",
		"--gateway-id", fmt.Sprintf("bench-%s-%d", cfg.run, n), "--log-level", "warn"}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"--conn-ttl", cfg.ConnTTL},
		{"--heartbeat-interval", cfg.HeartbeatInterval},
		{"--batch-interval", cfg.BatchInterval},
		{"--offline-grace", cfg.OfflineGrace},
	} {
		if f.d != 0 {
			args = append(args, f.name, f.d.String())
		}
	}
	return append(args, cfg.GatewayArgs...)
}

// restartGateway stops gateway g with sig and starts it again on the same
// address. It returns when the new process is ready.
func (s *sut) restartGateway(ctx context.Context, g *gateway, sig syscall.Signal) error {
	if g.proc == nil {
		return fmt.Errorf("%w: gateway %s was not started by this run", ErrInvalidConfig, g.addr)
	}
	if err := g.proc.Stop(sig, stopTimeout); err != nil {
		s.log.Warn("gateway stop", "gateway", g.n, "err", err)
	}
	if err := g.proc.Start(); err != nil {
		return fmt.Errorf("%w: %v", ErrSystem, err)
	}
	return awaitReady(ctx, g.proc, g.http)
}

// stop ends every process this run started, in the system's order:
// gateways first, with SIGKILL (their keys are thrown away with the NATS
// server), then the reaper and fanout, then NATS.
func (s *sut) stop() {
	if err := s.sys.Stop(); err != nil {
		s.log.Warn("system stop", "err", err)
	}
}

// writeGraph records mutual follows between every watcher and the targets
// it follows, concurrently.
func (s *sut) writeGraph(ctx context.Context, l Layout) error {
	if l.Watchers == 0 {
		return nil
	}
	if s.store == nil {
		return fmt.Errorf("%w: watchers need the follow graph: give --nats-url", ErrInvalidConfig)
	}
	type edge struct{ a, b string }
	edges := make(chan edge)
	errs := make(chan error, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for e := range edges {
				var err error
				for attempt := range 3 {
					if attempt > 0 {
						time.Sleep(100 * time.Millisecond)
					}
					wctx, c := context.WithTimeout(ctx, 10*time.Second)
					err = s.store.Follow(wctx, e.a, e.b)
					c()
					if err == nil {
						break
					}
				}
				if err != nil {
					select {
					case errs <- fmt.Errorf("%w: follow %s -> %s: %v", ErrSystem, e.a, e.b, err):
					default:
					}
					cancel()
				}
			}
		})
	}
	func() {
		defer close(edges)
		for w := range l.Watchers {
			wu := l.User(RoleWatcher, w)
			for _, t := range l.Followed(w) {
				tu := l.User(RoleTarget, t)
				for _, e := range []edge{{wu, tu}, {tu, wu}} {
					select {
					case edges <- e:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	return ctx.Err()
}

// parseGatewayURL accepts ws://host:port/ws, http://host:port or
// host:port.
func parseGatewayURL(s string) (*gateway, error) {
	raw := s
	if !strings.Contains(s, "://") {
		s = "ws://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Hostname() == "" || strings.Trim(u.Hostname(), ":") == "" {
		return nil, fmt.Errorf("%w: gateway URL %q: want ws://host:port/ws or host:port", ErrInvalidConfig, raw)
	}
	scheme := "ws"
	httpScheme := "http"
	switch u.Scheme {
	case "ws", "http":
	case "wss", "https":
		scheme, httpScheme = "wss", "https"
	default:
		return nil, fmt.Errorf("%w: gateway URL %q: want ws, wss, http or https", ErrInvalidConfig, raw)
	}
	return &gateway{addr: u.Host, ws: scheme + "://" + u.Host + "/ws", http: httpScheme + "://" + u.Host}, nil
}

// freeAddr returns a loopback address whose port was free a moment ago,
// outside the range where other processes' ports come from.
func freeAddr() (string, error) {
	addr, err := freeport.Addr()
	if err != nil {
		return "", fmt.Errorf("%w: find a free port: %v", ErrSystem, err)
	}
	return addr, nil
}

// awaitReady polls base/readyz until it answers 200, the child exits, or
// readyTimeout passes.
func awaitReady(ctx context.Context, c *system.Child, base string) error {
	deadline := time.Now().Add(readyTimeout)
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		if c != nil {
			if done, err := c.Exited(); done {
				return fmt.Errorf("%w: %s exited (%v): %s", ErrSystem, c.Name(), err, c.Tail())
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			name := base
			if c != nil {
				name = c.Name()
			}
			return fmt.Errorf("%w: %s not ready within %v", ErrSystem, name, readyTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// procSample is what /proc says of a process.
type procSample struct {
	rss int64         // resident set, bytes
	cpu time.Duration // user and system time
}

// userHZ is the unit of /proc/<pid>/stat times on Linux.
const userHZ = 100

// readProc reads VmRSS from /proc/<pid>/status and utime+stime from
// /proc/<pid>/stat.
func readProc(pid int) (procSample, error) {
	var ps procSample
	base := "/proc/" + strconv.Itoa(pid)
	f, err := os.Open(base + "/status")
	if err != nil {
		return ps, err
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fields := strings.Fields(v)
			if len(fields) == 2 && fields[1] == "kB" {
				kb, err := strconv.ParseInt(fields[0], 10, 64)
				if err == nil {
					ps.rss = kb << 10
				}
			}
		}
	}
	_ = f.Close()
	stat, err := os.ReadFile(base + "/stat")
	if err != nil {
		return ps, err
	}
	// The command name may hold spaces: fields start after its ')'.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return ps, errors.New("unexpected /proc stat format")
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 13 {
		return ps, errors.New("unexpected /proc stat format")
	}
	ut, err1 := strconv.ParseInt(fields[11], 10, 64)
	st, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return ps, errors.New("unexpected /proc stat format")
	}
	ps.cpu = time.Duration(ut+st) * time.Second / userHZ
	return ps, nil
}

// scrape reads a Prometheus text page into a map from the series (name
// and labels, as written) to its value.
func scrape(ctx context.Context, base string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics parses the Prometheus text format, ignoring comments.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := make(map[string]float64)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		// The value follows the last space outside the labels; a
		// timestamp may follow it.
		end := strings.LastIndexByte(line, '}')
		rest := line
		series := ""
		if end >= 0 {
			series, rest = line[:end+1], line[end+1:]
		} else {
			sp := strings.IndexByte(line, ' ')
			if sp < 0 {
				continue
			}
			series, rest = line[:sp], line[sp:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[series] = v
	}
	return out, sc.Err()
}
