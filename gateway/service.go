package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/gateway/internal/netpoll"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
)

// Service is a gateway: it terminates client WebSockets and serves the HTTP
// API on one listener, keeps a connection key alive per socket while its
// heartbeats arrive, writes users' chosen statuses, answers subscriptions
// with snapshots, and delivers changes to watching sockets in batches.
type Service struct {
	nc  *nats.Conn
	cfg Config
	log *slog.Logger

	reg     *prometheus.Registry
	metrics *gatewayMetrics

	// Set up by Serve.
	ctx      context.Context
	store    *presence.Store
	asyncJS  jetstream.JetStream
	poller   *netpoll.Poller
	readSem  chan struct{}
	regSem   chan struct{} // upgrades being registered (MaxRegistering)
	registry *registry
	hub      *hub
	flusher  *flusher
	authz    *authorizer
	online   *onlineIndex
	ready    atomic.Bool
	draining atomic.Bool
	served   atomic.Bool

	// bg tracks work that must finish before Serve returns: settling the
	// keys of closed connections.
	bg tasks
}

// tasks tracks background work that Serve waits for before it returns.
// Once closed, it starts nothing more. It is safe for concurrent use.
type tasks struct {
	mu     sync.Mutex
	wg     sync.WaitGroup
	closed bool
}

// Go runs fn in a goroutine and reports true, or reports false once the
// group is closed.
func (t *tasks) Go(fn func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Go(fn)
	return true
}

// close stops new work and waits for what runs.
func (t *tasks) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}

// New validates cfg and returns a gateway that will use nc. It starts no
// goroutines and does no I/O. The caller owns nc, and keeps it open until
// Serve has returned.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{
		nc:       nc,
		cfg:      cfg,
		log:      cfg.Logger.With("svc", "gateway"),
		reg:      metrics.NewRegistry(),
		ctx:      context.Background(),
		registry: newRegistry(),
	}
	s.hub = newHub(s)
	s.flusher = &flusher{s: s}
	s.authz = newAuthorizer(s)
	s.online = newOnlineIndex(s)
	s.metrics = newGatewayMetrics(s.reg, s)
	return s, nil
}

// ID returns the gateway's id.
func (s *Service) ID() string { return s.cfg.ID }

// Config returns the gateway's configuration, with defaults filled in.
func (s *Service) Config() Config { return s.cfg }

// Registry returns the registry holding the gateway's metrics, which
// GET /metrics serves.
func (s *Service) Registry() *prometheus.Registry { return s.reg }

// Conns returns how many client connections are open.
func (s *Service) Conns() int { return s.registry.len() }

// Serve accepts connections on ln until ctx is canceled: WebSocket upgrades
// on GET /ws, and the HTTP API on every other path. Then it stops
// accepting, closes every socket with 1001 (spread over DrainPeriod), lets
// their keys live out the offline grace, and returns nil. Serve closes ln.
// It may be called once.
func (s *Service) Serve(ctx context.Context, ln net.Listener) error {
	if s.served.Swap(true) {
		return errors.New("gateway: Serve called twice")
	}
	defer ln.Close()
	store, err := presence.Open(ctx, s.nc, s.cfg.Buckets)
	if err != nil {
		return err
	}
	s.store = store
	store.OnConflict(s.metrics.statusConflicts.Inc)
	s.asyncJS, err = jetstream.New(s.nc,
		jetstream.WithPublishAsyncMaxPending(s.cfg.KVMaxPending),
		jetstream.WithPublishAsyncTimeout(5*time.Second),
		jetstream.WithPublishAsyncAckHandler(s.refreshAcked),
		jetstream.WithPublishAsyncErrHandler(s.refreshFailed),
	)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if netpoll.Supported {
		if s.poller, err = netpoll.New(); err != nil {
			return err
		}
	}
	s.readSem = make(chan struct{}, s.cfg.ReadWorkers)
	s.regSem = make(chan struct{}, s.cfg.MaxRegistering)

	// Everything below stops when stop is called, after the sockets have
	// been closed.
	run, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	s.ctx = run
	// The socket loops (reading, liveness and key refreshes) run until
	// every socket has been drained, so that a socket waiting for its turn
	// to close stays live, its key kept alive; the rest stops after them.
	ioCtx, stopIO := context.WithCancel(run)
	defer stopIO()
	var loops, ioLoops sync.WaitGroup

	selfSub, err := s.nc.ChanSubscribe(presence.SelfSubject(s.cfg.ID), s.hub.events)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", presence.SelfSubject(s.cfg.ID), err)
	}
	_ = selfSub.SetPendingLimits(-1, -1)
	var dispatched sync.WaitGroup
	dispatched.Go(func() { s.hub.dispatch(presence.SelfSubject(s.cfg.ID)) })

	if err := s.authz.start(run); err != nil {
		_ = selfSub.Unsubscribe()
		close(s.hub.events)
		dispatched.Wait()
		return err
	}
	if s.cfg.Policy == PolicyEveryone {
		if err := s.online.start(run, s.store, s.log); err != nil {
			_ = selfSub.Unsubscribe()
			close(s.hub.events)
			dispatched.Wait()
			return err
		}
	}
	loops.Go(func() { s.flusher.run(run) })
	loops.Go(func() { s.watchNATS(run) })
	ioLoops.Go(func() { s.sweep(ioCtx) })
	if s.poller != nil {
		ioLoops.Go(func() { s.pollLoop(ioCtx) })
	}

	httpSrv := &http.Server{
		Handler:           s.httpHandler(),
		ReadHeaderTimeout: s.cfg.HandshakeTimeout,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return run },
	}
	httpLn := newChanListener(ln.Addr())
	var served sync.WaitGroup
	served.Go(func() { _ = httpSrv.Serve(httpLn) })

	var handshakes sync.WaitGroup
	accepted := make(chan error, 1)
	go func() { accepted <- s.accept(ln, httpLn, &handshakes) }()

	s.ready.Store(true)
	ops, err := s.startAdmin(ln.Addr().String())
	if err != nil {
		// Clients are served without it; operators see why in the log.
		s.log.Error("admin service not started", "err", err)
	}
	s.log.Info("gateway serving", "addr", ln.Addr().String(), "gateway", s.cfg.ID, "dev_auth", s.cfg.DevAuth, "policy", string(s.cfg.Policy))

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-accepted:
		serveErr = fmt.Errorf("accept: %w", serveErr)
	}

	// Shut down: refuse new work, close the sockets, then stop the loops.
	s.draining.Store(true)
	s.ready.Store(false)
	if ops != nil {
		if err := ops.Stop(); err != nil {
			s.log.Error("stop admin service", "err", err)
		}
	}
	_ = ln.Close()
	if serveErr == nil {
		<-accepted
	}
	handshakes.Wait()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = httpSrv.Shutdown(shutdownCtx)
	cancel()
	served.Wait()
	s.drain()
	stopIO()
	ioLoops.Wait()
	s.bg.close()
	stop()
	loops.Wait()
	if s.poller != nil {
		_ = s.poller.Release()
	}
	_ = selfSub.Unsubscribe()
	s.hub.closeAll()
	close(s.hub.events)
	dispatched.Wait()
	s.log.Info("gateway stopped", "gateway", s.cfg.ID)
	return serveErr
}

// accept accepts connections until ln is closed, sorting WebSocket
// upgrades from HTTP requests.
func (s *Service) accept(ln net.Listener, httpLn *chanListener, handshakes *sync.WaitGroup) error {
	defer httpLn.Close()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of files, most often: back off, as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Warn("accept", "err", err, "retry_in", delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		handshakes.Go(func() { s.handshake(nc, httpLn) })
	}
}

// drain closes every socket with 1001, spread over DrainPeriod with jitter,
// and waits until all are closed.
func (s *Service) drain() {
	var all []*conn
	s.registry.each(func(c *conn) { all = append(all, c) })
	if len(all) == 0 {
		return
	}
	s.log.Info("gateway draining", "conns", len(all), "period", s.cfg.DrainPeriod.String())
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	start := time.Now()
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	for i, c := range all {
		if s.cfg.DrainPeriod > 0 {
			at := start.Add(time.Duration(int64(s.cfg.DrainPeriod) * int64(i) / int64(len(all))))
			time.Sleep(time.Until(at))
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c.end(endClean, 1001, "gateway draining")
		})
	}
	wg.Wait()
}

// watchNATS reacts to the NATS connection coming back: connection keys
// may have expired and events may have been missed meanwhile, so every
// connection key is written again at once (and created again where it
// expired), and every watched user's state is read again.
func (s *Service) watchNATS(ctx context.Context) {
	ch := s.nc.StatusChanged(nats.CONNECTED)
	defer s.nc.RemoveStatusListener(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
		s.log.Info("nats connection back: re-asserting connections and resyncing watched users")
		s.registry.each(func(c *conn) { c.writtenAt.Store(0) })
		s.resync(ctx)
	}
}

// resync reads the state of every watched user and delivers what is newer
// than what the watchers have, through the dispatcher.
func (s *Service) resync(ctx context.Context) {
	for _, u := range s.hub.watchedUsers() {
		if ctx.Err() != nil {
			return
		}
		rec, rev, err := s.store.Status(ctx, u)
		if err != nil && !errors.Is(err, presence.ErrNotFound) {
			s.log.Warn("resync", "user_id", u, "err", err)
			continue
		}
		ev := presence.Event{UserID: u, Status: presence.Offline, Rev: rev}
		if err == nil {
			p := rec.Presence(u)
			ev.Status, ev.LastSeen, ev.At = p.Status, p.LastSeen, rec.Updated
		}
		s.hub.inject(ctx, &ev)
	}
}

// Ready reports whether the gateway serves: NATS connected, buckets
// present, not draining.
func (s *Service) Ready(ctx context.Context) error {
	if !s.ready.Load() {
		if s.draining.Load() {
			return fmt.Errorf("%w: draining", ErrUnavailable)
		}
		return fmt.Errorf("%w: starting", ErrUnavailable)
	}
	return s.store.Ready(ctx)
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}
