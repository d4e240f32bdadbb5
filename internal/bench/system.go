package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/pkg/presence"
)

// readyTimeout bounds the wait for a started process to be ready.
const readyTimeout = 60 * time.Second

// stopTimeout bounds the wait for a signaled process to exit.
const stopTimeout = 60 * time.Second

// sut is the greendot system under test: processes this run started, or
// addresses of an existing deployment.
type sut struct {
	cfg  *Config
	log  *slog.Logger
	dir  string
	nats *server.Server // embedded, when this run started NATS
	url  string         // NATS URL
	nc   *nats.Conn
	// store writes the follow graph.
	store    *presence.Store
	gateways []*gateway
	others   []*child // reaper and fanout
}

// gateway is one gateway of the system.
type gateway struct {
	n    int
	ws   string // ws://host:port/ws
	http string // http://host:port
	addr string // host:port
	proc *child // nil for an existing gateway
}

// child is a process this run started.
type child struct {
	name string
	args []string
	log  string // its stderr, in the work directory
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// pid returns the process id, or 0.
func (c *child) pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// start runs the child's command.
func (c *child) start(binary string) error {
	f, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(binary, c.args...)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return fmt.Errorf("%w: start %s: %v", ErrSystem, c.name, err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done, c.err = cmd, done, nil
	c.mu.Unlock()
	go func() {
		err := cmd.Wait()
		_ = f.Close()
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(done)
	}()
	return nil
}

// exited reports whether the child has exited, and how.
func (c *child) exited() (bool, error) {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done == nil {
		return true, nil
	}
	select {
	case <-done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return true, c.err
	default:
		return false, nil
	}
}

// stop sends sig and waits for the child to exit, killing it after
// stopTimeout.
func (c *child) stop(sig syscall.Signal) {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(stopTimeout):
		_ = cmd.Process.Kill()
		<-done
	}
}

// tail returns the end of the child's log, for an error message.
func (c *child) tail() string {
	b, err := os.ReadFile(c.log)
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

// childEnv is the environment of the processes the bench starts: its own,
// without the GREENDOT_ variables, so that only the bench's flags configure
// the system under test.
func childEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GREENDOT_") })
}

// startSystem starts what the configuration asks for: an embedded NATS
// server unless NATSURL is set, gateways (unless GatewayURLs are given), a
// reaper and a fanout.
func startSystem(ctx context.Context, cfg *Config, log *slog.Logger, dir string) (sys *sut, err error) {
	s := &sut{cfg: cfg, log: log, dir: dir, url: cfg.NATSURL}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	if s.url == "" {
		if err := s.startNATS(); err != nil {
			return nil, err
		}
	}
	if s.url != "" {
		nc, err := nats.Connect(s.url, nats.Name("greendot-bench"), nats.MaxReconnects(-1))
		if err != nil {
			return nil, fmt.Errorf("%w: connect to NATS at %s: %v", ErrSystem, s.url, err)
		}
		s.nc = nc
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s.store, err = presence.Open(octx, nc, presence.BucketOptions{})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%w: open buckets: %v", ErrSystem, err)
		}
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
	for _, kind := range []string{"reaper", "fanout"} {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		c := &child{
			name: kind,
			args: []string{kind, "--nats-url", s.url, "--metrics-listen", addr, "--log-level", "warn"},
			log:  filepath.Join(dir, kind+".log"),
		}
		s.others = append(s.others, c)
		if err := c.start(cfg.Greendot); err != nil {
			return nil, err
		}
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
		g.proc = &child{
			name: fmt.Sprintf("gateway %d", i),
			args: s.gatewayArgs(i, addr),
			log:  filepath.Join(dir, fmt.Sprintf("gateway-%d.log", i)),
		}
		s.gateways = append(s.gateways, g)
		if err := g.proc.start(cfg.Greendot); err != nil {
			return nil, err
		}
	}
	for _, g := range s.gateways {
		if err := awaitReady(ctx, g.proc, g.http); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// gatewayArgs returns the command line of gateway n.
func (s *sut) gatewayArgs(n int, addr string) []string {
	cfg := s.cfg
	args := []string{"gateway", "--listen", addr, "--nats-url", s.url, "--dev-auth",
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

// startNATS runs an embedded NATS server with JetStream, its store in the
// work directory.
func (s *sut) startNATS() error {
	ns, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  filepath.Join(s.dir, "nats"),
		NoLog:     true,
		NoSigs:    true,
		// One connection per process kind and worker, but the
		// gateways' subscriptions and pending acks can be many.
		MaxPending: 256 << 20,
	})
	if err != nil {
		return fmt.Errorf("%w: NATS server: %v", ErrSystem, err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return fmt.Errorf("%w: NATS server not ready within 30s", ErrSystem)
	}
	s.nats, s.url = ns, ns.ClientURL()
	return nil
}

// restartGateway stops gateway g with sig and starts it again on the same
// address. It returns when the new process is ready.
func (s *sut) restartGateway(ctx context.Context, g *gateway, sig syscall.Signal) error {
	if g.proc == nil {
		return fmt.Errorf("%w: gateway %s was not started by this run", ErrInvalidConfig, g.addr)
	}
	g.proc.stop(sig)
	if err := g.proc.start(s.cfg.Greendot); err != nil {
		return err
	}
	return awaitReady(ctx, g.proc, g.http)
}

// stop ends every process this run started: gateways first, with SIGKILL
// (their keys are thrown away with the NATS server), then the reaper and
// fanout, then NATS.
func (s *sut) stop() {
	var wg sync.WaitGroup
	for _, g := range s.gateways {
		if g.proc != nil {
			wg.Go(func() { g.proc.stop(syscall.SIGKILL) })
		}
	}
	wg.Wait()
	for _, c := range s.others {
		wg.Go(func() { c.stop(syscall.SIGTERM) })
	}
	wg.Wait()
	if s.nc != nil {
		s.nc.Close()
	}
	if s.nats != nil {
		s.nats.Shutdown()
		s.nats.WaitForShutdown()
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

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("%w: find a free port: %v", ErrSystem, err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// awaitReady polls base/readyz until it answers 200, the child exits, or
// readyTimeout passes.
func awaitReady(ctx context.Context, c *child, base string) error {
	deadline := time.Now().Add(readyTimeout)
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		if c != nil {
			if done, err := c.exited(); done {
				return fmt.Errorf("%w: %s exited (%v): %s", ErrSystem, c.name, err, c.tail())
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
				name = c.name
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
