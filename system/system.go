package system

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/webhook"
)

// Options configures a System.
type Options struct {
	// Name starts the name of every NATS connection the system makes: with
	// "greendot standalone", the gateway's is "greendot standalone
	// gateway". Empty means "greendot".
	Name string
	// NATS, when set, is the embedded NATS server Start starts; its Logger
	// defaults to Logger. Without it the system uses the NATS servers at
	// URL.
	NATS *NATSConfig
	// InProcess makes the system's connections to its embedded server
	// in-process (nats.InProcessServer) rather than over the server's
	// listener. They always are when the server has no listener.
	InProcess bool
	// URL names the NATS servers (comma-separated URLs) of a system that
	// embeds none.
	URL string
	// NATSOptions are further options of every NATS connection the system
	// makes, applied last.
	NATSOptions []nats.Option
	// Logger receives the log of the system's NATS connections, and of the
	// embedded server unless NATS has a Logger; nil discards it.
	Logger *slog.Logger
	// StopTimeout bounds each wait of Stop: for a service to return, or for
	// a child process to exit after its signal (it is killed then). Zero
	// means DefaultStopTimeout.
	StopTimeout time.Duration
}

// System is a running greendot system: its NATS server (embedded, or
// named), the services it runs in this process and the child processes
// it started. Its methods are safe for concurrent use. The System owns
// every part it starts, and Stop ends them all.
type System struct {
	opts   Options
	log    *slog.Logger
	nats   *server.Server // nil unless embedded
	exited chan struct{}
	once   sync.Once

	stopOnce sync.Once
	stopErr  error

	mu       sync.Mutex
	stopped  bool
	procs    []*Proc
	children []*Child
	conns    []*nats.Conn
}

// Start starts a system: its embedded NATS server, when opts.NATS is set.
// Services and child processes are started with the System's methods.
func Start(opts Options) (*System, error) {
	opts.Name = cmp.Or(opts.Name, "greendot")
	s := &System{opts: opts, log: opts.Logger, exited: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if opts.NATS == nil {
		if opts.URL == "" {
			return nil, errors.New("system: neither an embedded NATS server nor a NATS URL")
		}
		return s, nil
	}
	cfg := *opts.NATS
	if cfg.Logger == nil {
		cfg.Logger = s.log
	}
	srv, err := StartNATS(cfg)
	if err != nil {
		return nil, err
	}
	s.nats = srv
	return s, nil
}

// NATS returns the embedded NATS server, or nil.
func (s *System) NATS() *server.Server { return s.nats }

// URL returns where processes outside this one reach the system's NATS: the
// embedded server's client URL (empty when it listens for none), or
// Options.URL.
func (s *System) URL() string {
	if s.nats == nil {
		return s.opts.URL
	}
	if s.opts.NATS.InProcessOnly {
		return ""
	}
	return s.nats.ClientURL()
}

// Exited returns a channel closed when the first service or child process
// of the system ends before Stop: by a failure, since they run until they
// are stopped, or by a caller's own Stop or signal.
func (s *System) Exited() <-chan struct{} { return s.exited }

// exit is the hook every part calls when it ends.
func (s *System) exit() {
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if !stopped {
		s.once.Do(func() { close(s.exited) })
	}
}

// connOptions says how a part of the system named name connects.
func (s *System) connOptions(name string) natsconn.Options {
	o := natsconn.Options{URL: s.opts.URL, Name: s.opts.Name + " " + name, Logger: s.log}
	if s.nats != nil {
		o.URL = s.nats.ClientURL()
		if s.opts.InProcess || s.opts.NATS.InProcessOnly {
			o.Extra = append(o.Extra, nats.InProcessServer(s.nats))
		}
	}
	o.Extra = append(o.Extra, s.opts.NATSOptions...)
	return o
}

// add registers a part under the lock, unless the system is stopped.
func (s *System) add(f func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("system: stopped")
	}
	f()
	return nil
}

// Connect returns a new connection to the system's NATS, named after name.
// The System owns it and closes it in Stop, after every service and child
// has stopped.
func (s *System) Connect(name string) (*nats.Conn, error) {
	nc, err := natsconn.Connect(s.connOptions(name))
	if err != nil {
		return nil, err
	}
	if err := s.add(func() { s.conns = append(s.conns, nc) }); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}

// StartGateway runs a gateway named name with cfg in this process, over a
// connection of its own, serving ln. It owns ln from the call on, as the
// function StartGateway does.
func (s *System) StartGateway(name string, cfg gateway.Config, ln net.Listener) (*Gateway, error) {
	g, err := startGateway(name, s.connOptions(name), cfg, ln, s.exit)
	if err != nil {
		return nil, err
	}
	return g, s.keep(g.Proc)
}

// StartReaper runs a reaper named name with cfg in this process, over a
// connection of its own.
func (s *System) StartReaper(name string, cfg reaper.Config) (*Proc, error) {
	p, err := startReaper(name, s.connOptions(name), cfg, s.exit)
	if err != nil {
		return nil, err
	}
	return p, s.keep(p)
}

// StartFanout runs a fanout named name with cfg in this process, over a
// connection of its own.
func (s *System) StartFanout(name string, cfg fanout.Config) (*Proc, error) {
	p, err := startFanout(name, s.connOptions(name), cfg, s.exit)
	if err != nil {
		return nil, err
	}
	return p, s.keep(p)
}

// StartWebhooks runs a webhooks process named name with cfg in this
// process, over a connection of its own.
func (s *System) StartWebhooks(name string, cfg webhook.Config) (*Proc, error) {
	p, err := startWebhooks(name, s.connOptions(name), cfg, s.exit)
	if err != nil {
		return nil, err
	}
	return p, s.keep(p)
}

// keep registers a started service, or stops it when the system is stopped.
func (s *System) keep(p *Proc) error {
	if err := s.add(func() { s.procs = append(s.procs, p) }); err != nil {
		_ = p.Stop(s.opts.StopTimeout)
		return err
	}
	return nil
}

// StartChild starts a child process that Stop ends with its StopSignal, in
// the order of its Kind.
func (s *System) StartChild(opts ChildOptions) (*Child, error) {
	c := &Child{opts: opts, onExit: s.exit}
	if err := c.Start(); err != nil {
		return nil, err
	}
	if err := s.add(func() { s.children = append(s.children, c) }); err != nil {
		_ = c.Kill()
		return nil, err
	}
	return c, nil
}

// Gatherer gathers the metrics of every service the system runs in this
// process as those of one process: each metric family once, from the first
// service that has it, since every service's registry holds the Go runtime
// and process metrics of the one process. It suits a system with one
// service of each kind, such as standalone mode.
func (s *System) Gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		s.mu.Lock()
		procs := slices.Clone(s.procs)
		s.mu.Unlock()
		var (
			out  []*dto.MetricFamily
			errs []error
			seen = map[string]bool{}
		)
		for _, p := range procs {
			mfs, err := p.Registry().Gather()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
			}
			for _, mf := range mfs {
				if !seen[mf.GetName()] {
					seen[mf.GetName()] = true
					out = append(out, mf)
				}
			}
		}
		slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return cmp.Compare(a.GetName(), b.GetName()) })
		return out, errors.Join(errs...)
	})
}

// Ready reports whether every part of the system is ready: its embedded
// NATS server accepts connections and runs JetStream, then each service
// it runs in this process is ready, checked in the order they were
// started. For the first part that is not, it returns a
// *metrics.PartNotReady naming it, "nats" or the service's name, with its
// reason. Child processes are not checked.
func (s *System) Ready(ctx context.Context) error {
	if s.nats != nil {
		if err := natsReady(s.nats); err != nil {
			return &metrics.PartNotReady{Part: "nats", Err: err}
		}
	}
	s.mu.Lock()
	procs := slices.Clone(s.procs)
	s.mu.Unlock()
	for _, p := range procs {
		if err := p.Ready(ctx); err != nil {
			return &metrics.PartNotReady{Part: p.name, Err: err}
		}
	}
	return nil
}

// AwaitReady waits until every part of the system is ready (Ready) and
// returns nil. It returns an error wrapping ErrStopped when a service or
// child process of the system ends first (Exited), one wrapping
// ErrTimeout and the last error of Ready (a *metrics.PartNotReady) after
// timeout (zero means DefaultStartTimeout), or ctx's error when ctx ends
// first.
func (s *System) AwaitReady(ctx context.Context, timeout time.Duration) error {
	return awaitReady(ctx, timeout, s.opts.Name, s.Ready, s.exited)
}

// Stop stops the system in order and returns what went wrong: the
// gateways first (services and child processes, at once), so that what
// their closing sockets write is still processed; then the reapers,
// fanouts and every other child; then the connections of Connect; then the
// embedded NATS server. It returns the errors of the services it stopped
// and of the children that did not exit cleanly on their StopSignal;
// services already stopped by their own Stop are not counted again. Later
// calls return the same.
func (s *System) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *System) stop() error {
	s.mu.Lock()
	s.stopped = true
	procs, children, conns := s.procs, s.children, s.conns
	s.mu.Unlock()

	var (
		errMu sync.Mutex
		errs  []error
	)
	note := func(err error) {
		if err != nil {
			errMu.Lock()
			errs = append(errs, err)
			errMu.Unlock()
		}
	}
	stage := func(gateways bool) {
		var wg sync.WaitGroup
		for _, p := range procs {
			if (p.kind == KindGateway) == gateways && !p.stopping.Load() {
				wg.Go(func() { note(p.Stop(s.opts.StopTimeout)) })
			}
		}
		for _, c := range children {
			if (c.opts.Kind == KindGateway) == gateways {
				sig := cmp.Or(c.opts.StopSignal, syscall.SIGTERM)
				wg.Go(func() { note(c.Stop(sig, s.opts.StopTimeout)) })
			}
		}
		wg.Wait()
	}
	stage(true)
	stage(false)
	for _, nc := range conns {
		closeConn(nc)
	}
	if s.nats != nil {
		s.nats.Shutdown()
		s.nats.WaitForShutdown()
	}
	return errors.Join(errs...)
}
