package system

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/webhook"
)

// DefaultStopTimeout bounds the wait for a stopped service to return, or
// for a signaled child process to exit, unless a caller says otherwise.
const DefaultStopTimeout = 60 * time.Second

// readyCheckTimeout bounds one readiness check of AwaitReady.
const readyCheckTimeout = 2 * time.Second

// Kind is a kind of greendot process. It decides when a System's Stop
// stops a part.
type Kind int

// The kinds of process.
const (
	// KindOther is a process of no greendot kind, such as a load
	// generator's worker. It stops with reapers and fanouts.
	KindOther Kind = iota
	// KindGateway processes stop first, draining their sockets.
	KindGateway
	// KindReaper processes stop after the gateways.
	KindReaper
	// KindFanout processes stop after the gateways.
	KindFanout
	// KindWebhooks processes stop after the gateways.
	KindWebhooks
)

// String returns the kind's command name: gateway, reaper, fanout,
// webhooks, other.
func (k Kind) String() string {
	switch k {
	case KindGateway:
		return "gateway"
	case KindReaper:
		return "reaper"
	case KindFanout:
		return "fanout"
	case KindWebhooks:
		return "webhooks"
	}
	return "other"
}

// service is what a Proc runs: a gateway, reaper, fanout or webhooks
// process.
type service interface {
	Ready(ctx context.Context) error
	Registry() *prometheus.Registry
}

var (
	_ service = (*gateway.Service)(nil)
	_ service = (*reaper.Service)(nil)
	_ service = (*fanout.Service)(nil)
	_ service = (*webhook.Service)(nil)
)

// Proc is a service running in this process over a NATS connection of its
// own: a gateway, a reaper, a fanout or a webhooks process. It runs from its start until Stop.
// The Proc owns the connection and the goroutine the service runs on. Its
// methods are safe for concurrent use.
type Proc struct {
	name   string
	kind   Kind
	nc     *nats.Conn
	svc    service
	cancel context.CancelFunc
	done   chan struct{}
	err    error // how the service returned; set before done is closed

	stopping atomic.Bool
	stopOnce sync.Once
	stopErr  error
}

// startProc connects with conn, builds a service over the connection and
// runs it on a goroutine of its own. build returns the service and the
// function that runs it until its context is canceled. onExit, when not
// nil, is called when that function has returned.
func startProc(name string, kind Kind, conn natsconn.Options, onExit func(),
	build func(*nats.Conn) (service, func(context.Context) error, error)) (*Proc, error) {
	if conn.Name == "" {
		conn.Name = name
	}
	nc, err := natsconn.Connect(conn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	svc, run, err := build(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proc{name: name, kind: kind, nc: nc, svc: svc, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if err := run(ctx); err != nil {
			p.err = fmt.Errorf("%s: %w", name, err)
		}
		if onExit != nil {
			onExit()
		}
	}()
	return p, nil
}

// Name returns the service's name, as errors give it.
func (p *Proc) Name() string { return p.name }

// Kind returns the service's kind.
func (p *Proc) Kind() Kind { return p.kind }

// Conn returns the service's NATS connection. It stays owned by the Proc,
// which closes it in Stop.
func (p *Proc) Conn() *nats.Conn { return p.nc }

// Registry returns the registry of the service's metrics.
func (p *Proc) Registry() *prometheus.Registry { return p.svc.Registry() }

// Done returns a channel closed when the service has returned.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err returns how the service returned, once Done is closed: nil after a
// clean stop. Before that it returns nil.
func (p *Proc) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Ready reports whether the service is ready, as its /readyz does.
func (p *Proc) Ready(ctx context.Context) error { return p.svc.Ready(ctx) }

// AwaitReady waits until the service is ready and returns nil. It returns
// an error wrapping ErrStopped when the service returns first, one wrapping
// ErrTimeout and the service's last readiness error after timeout (zero
// means DefaultStartTimeout), or ctx's error when ctx ends first.
func (p *Proc) AwaitReady(ctx context.Context, timeout time.Duration) error {
	return awaitReady(ctx, timeout, p.name, p.svc.Ready, p.done)
}

// awaitReady checks ready until it returns nil, as AwaitReady does; what
// names what is waited for in its errors, and stopped is closed when it
// will never be ready.
func awaitReady(ctx context.Context, timeout time.Duration, what string, ready func(context.Context) error, stopped <-chan struct{}) error {
	timeout = cmp.Or(timeout, DefaultStartTimeout)
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		checkCtx, cancel := context.WithTimeout(ctx, readyCheckTimeout)
		err := ready(checkCtx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w: %w", what, timeout, ErrTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stopped:
			return fmt.Errorf("%s %w before it was ready", what, ErrStopped)
		case <-tick.C:
		}
	}
}

// Stop cancels the service, waits up to timeout (zero means
// DefaultStopTimeout) for it to return, then sends what its NATS
// connection has buffered and closes it. It returns the service's error,
// or one wrapping ErrTimeout when it did not return in time. Later calls
// return the same.
func (p *Proc) Stop(timeout time.Duration) error {
	p.stopOnce.Do(func() {
		p.stopping.Store(true)
		p.cancel()
		timer := time.NewTimer(cmp.Or(timeout, DefaultStopTimeout))
		defer timer.Stop()
		select {
		case <-p.done:
			p.stopErr = p.err
		case <-timer.C:
			p.stopErr = fmt.Errorf("%s did not return within %v of its stop: %w", p.name, cmp.Or(timeout, DefaultStopTimeout), ErrTimeout)
		}
		closeConn(p.nc)
	})
	return p.stopErr
}

// closeConn sends what nc has buffered, if it is connected, and closes it.
func closeConn(nc *nats.Conn) {
	if nc.IsConnected() {
		_ = nc.FlushTimeout(2 * time.Second)
	}
	nc.Close()
}

// Gateway is a gateway running in this process.
type Gateway struct {
	*Proc
	// Service is the gateway.
	Service *gateway.Service
	// Addr is the address it listens on (host:port), WS its WebSocket URL
	// (ws://host:port/ws) and HTTP the base URL of its HTTP API.
	Addr, WS, HTTP string
}

// StartGateway connects to NATS with conn, builds a gateway with cfg, and
// serves ln with it on a goroutine until Stop. Its name is conn's Name. It
// owns ln from the call on: the gateway closes it when it stops, and
// StartGateway when it fails.
func StartGateway(conn natsconn.Options, cfg gateway.Config, ln net.Listener) (*Gateway, error) {
	return startGateway(conn.Name, conn, cfg, ln, nil)
}

func startGateway(name string, conn natsconn.Options, cfg gateway.Config, ln net.Listener, onExit func()) (*Gateway, error) {
	g := &Gateway{Addr: ln.Addr().String()}
	g.WS, g.HTTP = "ws://"+g.Addr+gateway.WebSocketPath, "http://"+g.Addr
	p, err := startProc(name, KindGateway, conn, onExit, func(nc *nats.Conn) (service, func(context.Context) error, error) {
		svc, err := gateway.New(nc, cfg)
		if err != nil {
			return nil, nil, err
		}
		g.Service = svc
		return svc, func(ctx context.Context) error { return svc.Serve(ctx, ln) }, nil
	})
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	g.Proc = p
	return g, nil
}

// StartReaper connects to NATS with conn, builds a reaper with cfg, and
// runs it on a goroutine until Stop. Its name is conn's Name.
func StartReaper(conn natsconn.Options, cfg reaper.Config) (*Proc, error) {
	return startReaper(conn.Name, conn, cfg, nil)
}

func startReaper(name string, conn natsconn.Options, cfg reaper.Config, onExit func()) (*Proc, error) {
	return startProc(name, KindReaper, conn, onExit, runner(func(nc *nats.Conn) (*reaper.Service, error) { return reaper.New(nc, cfg) }))
}

// StartFanout connects to NATS with conn, builds a fanout with cfg, and
// runs it on a goroutine until Stop. Its name is conn's Name.
func StartFanout(conn natsconn.Options, cfg fanout.Config) (*Proc, error) {
	return startFanout(conn.Name, conn, cfg, nil)
}

func startFanout(name string, conn natsconn.Options, cfg fanout.Config, onExit func()) (*Proc, error) {
	return startProc(name, KindFanout, conn, onExit, runner(func(nc *nats.Conn) (*fanout.Service, error) { return fanout.New(nc, cfg) }))
}

// StartWebhooks connects to NATS with conn, builds a webhooks process with
// cfg, and runs it on a goroutine until Stop. Its name is conn's Name.
func StartWebhooks(conn natsconn.Options, cfg webhook.Config) (*Proc, error) {
	return startWebhooks(conn.Name, conn, cfg, nil)
}

func startWebhooks(name string, conn natsconn.Options, cfg webhook.Config, onExit func()) (*Proc, error) {
	return startProc(name, KindWebhooks, conn, onExit, runner(func(nc *nats.Conn) (*webhook.Service, error) { return webhook.New(nc, cfg) }))
}

// runner adapts the constructor of a service that runs with Run (the
// reaper, the fanout, the webhooks process) to startProc.
func runner[S interface {
	service
	Run(context.Context) error
}](newService func(*nats.Conn) (S, error)) func(*nats.Conn) (service, func(context.Context) error, error) {
	return func(nc *nats.Conn) (service, func(context.Context) error, error) {
		svc, err := newService(nc)
		if err != nil {
			return nil, nil, err
		}
		return svc, svc.Run, nil
	}
}
