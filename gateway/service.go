package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/gateway/internal/apikeys"
	"github.com/greendot/greendot/gateway/internal/authz"
	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/gateway/internal/keyrate"
	"github.com/greendot/greendot/gateway/internal/outbox"
	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/internal/jsretry"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
)

// Service is a gateway: it terminates client WebSockets and serves the HTTP
// API on one listener, keeps a connection key per socket under its lease
// and closes a socket whose heartbeats stop, writes users' statuses,
// answers subscriptions with snapshots, and delivers changes to watching
// sockets in batches.
//
// Its parts, each with one job:
//
//   - registry: the open connections, by poller tag and by user;
//   - sockets: the pollers, the readers they hand readable sockets to,
//     and the stalled sockets, whose backlogs they write;
//   - registrar (keys): the one place that talks to NATS about a
//     connection: its key, its entry in the user's status record, its end;
//   - authorizer (authz): the one place that decides who may watch whom,
//     and registers the answer in the hub;
//   - hub: the subscriptions, and the events they deliver;
//   - scheduler (outbox): when the changes waiting for a socket are
//     written;
//   - each connection's socket (socket): the one place that writes to a
//     socket;
//   - online: global presence, under the everyone policy;
//   - rooms (roomHub): the member tables of the rooms this gateway's
//     connections are in;
//   - members (memberships): the connections' rooms: their room
//     messages, their keys in presence_rooms and their room frames;
//   - frames: what writes a protocol frame to a socket, for every part
//     that answers clients;
//   - api: the HTTP API (made by httpHandler).
type Service struct {
	nc  *nats.Conn
	cfg Config
	// frames writes frames to the sockets; its log and metrics are the
	// gateway's (s.log, s.metrics).
	frames

	reg *prometheus.Registry

	registry  *registry
	sockets   *sockets
	rooms     *roomHub
	members   *memberships
	hub       *hub.Hub
	scheduler *outbox.Scheduler
	linger    *socket.Linger
	env       *connEnv
	// events carries presence and self events from NATS to the dispatcher;
	// calls runs functions there, in order with the events.
	events chan *nats.Msg
	calls  chan func()
	// lost holds the states to read again because NATS dropped their
	// events (catchDrops); readLost reads them.
	lost *lostSubs[lostEvent]

	// Made by Serve, once the buckets are open.
	store  *presence.Store
	keys   *registrar
	authz  *authz.Authorizer
	online *onlineIndex
	// due has each connection looked at when its TTL, its token or
	// AwayAfter may have run out (lookAt).
	due    *dueRing
	regSem chan struct{} // upgrades being registered (MaxRegistering)
	// proxy is the connect proxy; nil without one.
	proxy *connectProxy
	// apiByUser and apiByAddr limit the HTTP API's requests per identity
	// and per source address.
	apiByUser, apiByAddr *keyrate.Limiter
	// apiKeys are Config.APIKeysFile's, and apiByKey limits the server
	// API's requests per key; nil without the file.
	apiKeys  *apikeys.Set
	apiByKey *keyrate.Limiter
	// workers are the goroutines handling the connections' requests.
	workers sync.WaitGroup

	ready    atomic.Bool
	draining atomic.Bool
	served   atomic.Bool
	// opened is the registrar, once open has made it, for what may run
	// while the gateway starts: Ready asks its lease why its take waits,
	// and the metrics read it.
	opened atomic.Pointer[registrar]
	// fatal carries what stops the gateway as a failure (see replaced).
	fatal chan error

	// hooks are set only by export_test.go.
	hooks hooks
}

// hooks are what tests have a gateway run at points of its work: each,
// when set, with the user whose work it is.
type hooks struct {
	// afterRegister runs once a connection is registered and upgraded,
	// before it is in the registry: what happens meanwhile (a lease lost,
	// a write of another device's) is what a slow start must survive.
	afterRegister atomic.Pointer[func(userID string)]
	// afterSnapshot runs once a subscribe has read its snapshots, before
	// it settles them: a revocation that lands meanwhile must not be
	// answered with presence_init after its denied.
	afterSnapshot atomic.Pointer[func(userID string)]
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
		nc:        nc,
		cfg:       cfg,
		frames:    frames{log: cfg.Logger.With("svc", "gateway")},
		reg:       metrics.NewRegistry(),
		registry:  newRegistry(cfg.MaxConnsPerUser),
		scheduler: outbox.NewScheduler(cfg.BatchInterval, cfg.BatchPace, cfg.WriteWorkers),
		linger:    socket.NewLinger(maxLingering, lingerTimeout, lingerBudget, cfg.MaxMessageSize),
		events:    make(chan *nats.Msg, cfg.buffers.events),
		lost:      newLostSubs[lostEvent](),
		calls:     make(chan func(), 1024),
		fatal:     make(chan error, 1),
		apiByUser: keyrate.New(cfg.APIRateLimit, cfg.APIRateBurst),
		apiByAddr: keyrate.New(cfg.APIAddressRateLimit, cfg.APIAddressRateBurst),
		apiByKey:  keyrate.New(cfg.APIKeyRateLimit, cfg.APIKeyRateBurst),
	}
	var subscribe func(string) (hub.Subscription, error)
	if cfg.Policy != PolicyEveryone {
		// Under the everyone policy one subscription carries every
		// user's events (see Serve); otherwise one per watched user.
		subscribe = s.subscribeEvents
	}
	s.hub = hub.New(subscribe)
	s.metrics = newGatewayMetrics(s.reg, s)
	s.proxy = newConnectProxy(cfg, nc, s.metrics)
	if s.proxy != nil && len(cfg.AllowedOrigins) == 0 {
		s.log.Warn("the connect proxy admits browsers by their cookies, and any Origin is allowed: a page of another site could connect as its visitor; set the allowed origins (--allowed-origins)")
	}
	s.sockets = &sockets{cfg: cfg, log: s.log, metrics: s.metrics, registry: s.registry, end: s.end}
	s.rooms = newRoomHub(nc, s.log, s.metrics, cfg.buffers.roomMsgs)
	s.members = &memberships{frames: s.frames, cfg: cfg, nc: nc, hub: s.rooms, registry: s.registry, enqueue: s.enqueue}
	s.env = &connEnv{handler: s, flushRooms: s.members.flush, scheduler: s.scheduler, metrics: s.metrics, end: s.end, stalled: s.sockets.stalled}
	return s, nil
}

// The bounds of lingering closes (socket.Linger): how many at once, for
// how long, and how many bytes each may read.
const (
	maxLingering  = 1024
	lingerTimeout = 2 * time.Second
	lingerBudget  = 1 << 20
)

// subscribeEvents subscribes to one user's presence events, into the
// dispatcher's channel.
func (s *Service) subscribeEvents(user string) (hub.Subscription, error) {
	return s.chanSubscribe(presence.EventSubject(user))
}

func (s *Service) chanSubscribe(subject string) (*nats.Subscription, error) {
	sub, err := s.nc.ChanSubscribe(subject, s.events)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subject, err)
	}
	// Events are small: a pending limit in messages keeps a burst from
	// being dropped by byte count.
	_ = sub.SetPendingLimits(-1, -1)
	return sub, nil
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
// their keys live out the offline grace, and returns nil. It returns an
// error when it cannot start, unless ctx was canceled meanwhile, when it
// can no longer accept, or, after stopping the same way, when its buckets
// were replaced (an error that wraps presence.ErrStoreReplaced: see
// replaced). Serve closes ln. It may be called once, and
// returns only after every goroutine it started has.
//
// It starts its parts in order and stops them in the reverse order:
//
//  1. the buckets and the parts that need them (registrar, authorizer,
//     online index), the poller;
//  2. the core: the event dispatcher, the scheduler of writes, the
//     graph watcher, the online index, the watcher of the NATS connection;
//  3. the sockets' loops: reading (the poller) and liveness (due);
//  4. serving: the HTTP server, the accept loop, the admin service.
//
// Until 4, the listener answers probes, and refuses the rest with 503
// (serveStarting). Stopping runs 4, then drains the sockets, then 3, then
// waits for the connections' last writes and closes, then 2.
func (s *Service) Serve(ctx context.Context, ln net.Listener) error {
	if s.served.Swap(true) {
		return errors.New("gateway: Serve called twice")
	}
	defer ln.Close()
	if s.cfg.TLSCertFile != "" {
		certs, err := loadCertFiles(s.cfg.TLSCertFile, s.cfg.TLSKeyFile, s.cfg.TLSReload, s.log)
		if err != nil {
			return err
		}
		ln = tls.NewListener(ln, certs.tlsConfig())
	}
	// Until it serves, probes get answers (serveStarting).
	stopStarting := sync.OnceFunc(s.serveStarting(ln))
	defer stopStarting()

	// 1. Resources.
	if err := s.open(ctx, ln.Addr().String()); err != nil {
		return startErr(ctx, err)
	}
	defer s.closeResources()

	// 2. The core. It runs until the sockets are closed.
	core := newGroup()
	defer core.stop()
	if err := s.startCore(ctx, core); err != nil {
		return startErr(ctx, err)
	}

	// 3. The sockets' loops, which keep a socket waiting for its turn to
	// close alive.
	io := newGroup()
	defer io.stop()
	io.Go(func(ctx context.Context) { s.due.run(ctx, s.lookAt) })
	if s.proxy != nil {
		io.Go(s.refreshSessions)
	}
	if s.cfg.MemoryTrimInterval > 0 {
		io.Go(func(ctx context.Context) { s.memoryTrim(ctx, s.cfg.MemoryTrimInterval) })
	}
	s.sockets.run(io)

	// 4. Serving.
	// A request's head (at most 32 KiB, as an upgrade's) and body must
	// come within the handshake timeout (the first request's counted from
	// the accept: httpConn), a kept-alive connection may wait as long for
	// the next, and an answer must go within the time it may take to
	// decide (answerWithin) and a write's: without them a client that
	// stops sending (a body announced and never sent, which net/http waits
	// for even before answering /healthz) holds its connection and a
	// goroutine for good.
	httpSrv := &http.Server{
		Handler:           withDeadline(s.httpHandler(), s.answerWithin()),
		ReadHeaderTimeout: s.cfg.HandshakeTimeout,
		ReadTimeout:       s.cfg.HandshakeTimeout,
		WriteTimeout:      s.answerWithin() + s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.HandshakeTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnState:         httpConnState,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return core.ctx },
	}
	httpLn := newChanListener(ln.Addr())
	stopStarting()
	var served sync.WaitGroup
	served.Go(func() { _ = httpSrv.Serve(httpLn) })
	handshakes := newWorkerPoolKeeping(math.MaxInt, handshakersKept, func() struct{} { return struct{}{} },
		func(nc net.Conn, _ struct{}) { s.handshake(nc, httpLn) })
	sweeping := make(chan struct{})
	served.Go(func() { sweepEvery(sweeping, handshakes) })
	accepted := make(chan error, 1)
	served.Go(func() { accepted <- s.accept(ln, httpLn, handshakes) })
	s.ready.Store(true)
	ops, err := s.startAdmin(ln.Addr().String())
	if err != nil {
		// Clients are served without it; operators see why in the log.
		s.log.Error("admin service not started", "err", err)
	}
	s.log.Info("gateway serving", "addr", ln.Addr().String(), "gateway", s.cfg.ID, "dev_auth", s.cfg.DevAuth, "policy", string(s.cfg.Policy))

	var serveErr error
	acceptEnded := false
	select {
	case <-ctx.Done():
	case err := <-accepted:
		if err != nil {
			serveErr = fmt.Errorf("accept: %w", err)
		}
		acceptEnded = true
	case serveErr = <-s.fatal:
	}

	// Stop 4: refuse new work.
	s.draining.Store(true)
	s.ready.Store(false)
	if ops != nil {
		if err := ops.Stop(); err != nil {
			s.log.Error("stop admin service", "err", err)
		}
	}
	_ = ln.Close()
	if !acceptEnded {
		// No handshake may start once handshakes is waited for.
		<-accepted
	}
	handshakes.stop()
	close(sweeping)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = httpSrv.Shutdown(shutdownCtx)
	cancel()
	served.Wait()
	// Close the sockets, then stop 3.
	s.drain()
	s.sockets.wait()
	io.stop()
	s.workers.Wait()
	// The connections' last writes are made; those that live out the
	// offline grace are handed to the lease, whose end ends them; then
	// their close frames.
	stopCtx, cancel := context.WithTimeout(context.Background(), 2*requestTimeout)
	s.keys.stop(stopCtx)
	cancel()
	s.linger.Stop()
	// Stop 2 (deferred), then 1.
	s.log.Info("gateway stopped", "gateway", s.cfg.ID)
	return serveErr
}

// startErr returns err, the reason a start failed, or nil when ctx was
// canceled: a gateway asked to stop while it starts has not failed.
func startErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// open opens the buckets, takes the gateway's lease, and makes the parts
// that need them. addr is the listen address, for the lease.
func (s *Service) open(ctx context.Context, addr string) error {
	if s.cfg.APIKeysFile != "" {
		keys, err := apikeys.Open(s.cfg.APIKeysFile)
		if err != nil {
			return err
		}
		s.apiKeys = keys
	}
	// A cluster that is starting may not answer for a while: asked again.
	store, err := jsretry.Until(ctx, 100*time.Millisecond, 5*time.Second, func() (*presence.Store, error) {
		return presence.Open(ctx, s.nc, s.cfg.Buckets)
	}, func(err error, pause time.Duration) {
		s.log.Warn("open the buckets: no answer in time; trying again", "err", err, "retry_in", pause)
	})
	if err != nil {
		return err
	}
	store.OnConflict(s.metrics.statusConflicts.Inc)
	store.OnFeedLate(s.metrics.feedLate.Inc)
	store.ReadDirect()
	s.store = store
	if s.keys, err = newRegistrar(s.nc, store, s.cfg, addr, s.metrics, s.log); err != nil {
		return err
	}
	s.keys.onEnd, s.keys.onNewLease, s.keys.onReplaced = s.members.end, s.members.kickAll, s.replaced
	s.opened.Store(s.keys)
	// The self events of this gateway's own writes go to its sockets
	// without a round trip through NATS.
	s.keys.events.HandOver(s.cfg.ID, s.handSelf)
	s.members.opened(store, s.keys)
	if err := s.keys.start(ctx); err != nil {
		return err
	}
	s.authz = authz.New(authz.Config{
		Policy:    s.cfg.Policy,
		Graph:     store,
		CacheTTL:  s.cfg.AuthzCacheTTL,
		Hub:       s.hub,
		SocketsOf: s.registry.watchersOf,
		Notify:    notifier{s},
		Logger:    s.log,

		App:         s.appSource(),
		AppCacheTTL: s.cfg.AppCacheTTL,
		CacheLookup: s.metrics.cacheLookup,
	})
	if s.cfg.Policy == PolicyEveryone {
		s.online = newOnlineIndex(s.authz.LastSeenTo, s.hub.Watching)
	}
	if err := s.sockets.open(); err != nil {
		return err
	}
	s.regSem = make(chan struct{}, s.cfg.MaxRegistering)
	s.due = newDueRing(lookStep(s.cfg.ConnTTL), s.cfg.ConnTTL, nowNano())
	return nil
}

// closeResources releases what open made and the core used.
func (s *Service) closeResources() {
	if s.authz != nil {
		s.authz.Close()
	}
	s.sockets.release()
	s.hub.Close()
}

// startCore subscribes to the gateway's events and starts the core's
// loops in g.
func (s *Service) startCore(ctx context.Context, g *group) error {
	subjects := []string{presence.SelfSubject(s.cfg.ID)}
	if s.cfg.Policy == PolicyEveryone {
		subjects = append(subjects, presence.EventWildcard)
	}
	for _, subject := range subjects {
		sub, err := s.chanSubscribe(subject)
		if err != nil {
			return err
		}
		g.onStop(func() { _ = sub.Unsubscribe() })
	}
	roomSub, err := s.nc.Subscribe(presence.RoomLeaseEndedSubject, s.rooms.onLeaseEnded)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", presence.RoomLeaseEndedSubject, err)
	}
	g.onStop(func() { _ = roomSub.Unsubscribe() })
	g.onStop(s.catchDrops())
	g.Go(s.rooms.run)
	g.Go(s.rooms.relistLost)
	g.Go(s.readLost)
	g.Go(s.dispatch)
	g.Go(s.scheduler.Run)
	g.Go(func(ctx context.Context) { s.keys.run(ctx) })
	if r, ok := s.cfg.Tokens.(KeyRefresher); ok {
		g.Go(r.RefreshKeys)
	}
	if s.apiKeys != nil {
		g.Go(s.reloadAPIKeys)
	}
	graph, err := s.store.WatchGraph(ctx)
	if err != nil {
		return err
	}
	g.Go(func(ctx context.Context) { s.watchGraph(ctx, graph) })
	if s.online != nil {
		if err := s.online.sync(ctx, s.store); err != nil {
			return err
		}
		g.Go(s.online.run)
	}
	g.Go(s.watchNATS)
	if s.cfg.Policy == PolicyApp {
		sub, err := s.nc.Subscribe(InvalidateSubject, func(m *nats.Msg) { s.invalidated(g.ctx, m.Data) })
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", InvalidateSubject, err)
		}
		g.onStop(func() { _ = sub.Unsubscribe() })
	}
	return nil
}

// group runs goroutines until stop, which cancels their context, waits
// for them, then runs the functions given to onStop in reverse order.
type group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stops  []func()
	once   sync.Once
}

func newGroup() *group {
	ctx, cancel := context.WithCancel(context.Background())
	return &group{ctx: ctx, cancel: cancel}
}

// Go runs fn in a goroutine with the group's context.
func (g *group) Go(fn func(ctx context.Context)) { g.wg.Go(func() { fn(g.ctx) }) }

// onStop has stop run fn after the goroutines have returned.
func (g *group) onStop(fn func()) { g.stops = append(g.stops, fn) }

func (g *group) stop() {
	g.once.Do(func() {
		g.cancel()
		g.wg.Wait()
		for i := len(g.stops) - 1; i >= 0; i-- {
			g.stops[i]()
		}
	})
}

// accept accepts connections until ln is closed, sorting WebSocket
// upgrades from HTTP requests.
func (s *Service) accept(ln net.Listener, httpLn *chanListener, handshakes *workerPool[net.Conn, struct{}]) error {
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
		if !handshakes.run(nc) {
			_ = nc.Close()
		}
	}
}

// drain closes every socket with 1001, spread over DrainPeriod.
func (s *Service) drain() {
	all := s.registry.all()
	if len(all) == 0 {
		return
	}
	s.log.Info("gateway draining", "conns", len(all), "period", s.cfg.DrainPeriod.String())
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	start := time.Now()
	for i, c := range all {
		if s.cfg.DrainPeriod > 0 {
			at := start.Add(time.Duration(int64(s.cfg.DrainPeriod) * int64(i) / int64(len(all))))
			time.Sleep(time.Until(at))
		}
		s.end(c, endClean, ws.StatusGoingAway, "gateway draining")
	}
}

// end closes a connection, once: it takes it out of the poller, closes its
// socket (with a close frame carrying code, unless code is zero), forgets
// its subscriptions, and has the registrar end it as kind says: after the
// offline grace for a clean close, at once otherwise.
func (s *Service) end(c *conn, kind endKind, code ws.StatusCode, reason string) {
	if c.closed.Swap(true) {
		return
	}
	s.sockets.forget(c)
	c.sock.Close(code, reason, s.linger)
	if s.online != nil {
		s.online.unsubscribe(c)
	}
	s.hub.RemoveWatcher(c)
	s.members.hide(c)
	s.due.ended(c)
	if s.proxy != nil {
		s.proxy.forget(c)
	}
	s.registry.remove(c)
	s.metrics.closes(kind, code)
	if s.log.Enabled(context.Background(), levelDebug) {
		s.log.LogAttrs(context.Background(), levelDebug, "connection closed",
			attrUser(c.userID), attrConn(c.connID), attrReason(reason), attrCode(int(code)))
	}
	switch kind {
	case endClean:
		s.keys.close(c)
	case endDead:
		s.keys.died(c, c.lastFrame.Load()/1e6)
	default:
		s.keys.end(c, c.since)
	}
}

// replaced stops the gateway, as a failure: its buckets were created again
// since it opened them (err says which). It had better start again than
// compare the revisions it holds with the new buckets': a watched user's
// newest state, its users' own, its rooms' members' would hide the
// changes written there until the revisions caught up. Until it has
// stopped, its writes read each record first, and its sockets are closed
// with 1001 as when it is stopped, so that clients reconnect elsewhere.
func (s *Service) replaced(err error) {
	s.store.DistrustCopies()
	select {
	case s.fatal <- fmt.Errorf("gateway: %w", err):
	default:
	}
}

// watchNATS reacts to the NATS connection coming back: events may have
// been missed meanwhile, so every watched user's state (and under the
// everyone policy, every user's) is read again, until the reads succeed. (The
// lease tells whether the connections are still registered.) Under the app
// policy, invalidations may have been missed too: every cached answer of
// the app is dropped and the live subscriptions are decided again, before
// the resync, so that a watcher the app no longer allows is not shown what
// changed while the gateway was cut off.
func (s *Service) watchNATS(ctx context.Context) {
	natsconn.OnReconnect(ctx, s.nc, func() {
		// The buckets may have been replaced meanwhile (see replaced).
		s.store.DistrustCopies()
		if s.cfg.Policy == PolicyApp {
			s.log.Info("nats connection back: dropping the app's cached answers")
			s.authz.Invalidate(ctx, "", "")
		}
		s.log.Info("nats connection back: resyncing watched users, own users and rooms")
		s.resyncUsers(ctx, s.hub.Users())
		s.resyncSelf(ctx)
		s.rooms.relist(ctx)
		if s.online != nil {
			s.resyncOnline(ctx)
		}
	})
}

// resyncOnline reads every status record again for global presence, until
// the read succeeds.
func (s *Service) resyncOnline(ctx context.Context) {
	retryEach(ctx, []*onlineIndex{s.online}, func(o *onlineIndex) error {
		return o.sync(ctx, s.store)
	}, func(_ *onlineIndex, err error, pause time.Duration) {
		s.log.Warn("resync global presence", "err", err, "retry_in", pause)
	})
}

// resyncUsers reads the state of users and delivers what is newer than
// what their watchers have, through the dispatcher. A read that fails is
// tried again until it succeeds.
func (s *Service) resyncUsers(ctx context.Context, users []string) {
	retryEach(ctx, users, func(u string) error {
		p, rev, at, err := s.presenceOf(ctx, u)
		if err != nil {
			return err
		}
		ev := presence.Event{UserID: u, Status: p.Status, LastSeen: p.LastSeen, Platforms: p.Platforms, Custom: p.Custom, Rev: rev, At: at}
		s.call(ctx, func() { s.deliver(&ev) })
		return nil
	}, func(u string, err error, pause time.Duration) {
		s.log.Warn("resync", "user_id", u, "err", err, "retry_in", pause)
	})
}

// Ready reports whether the gateway serves: NATS connected, buckets
// present, its lease held and its connections registered under it, not
// draining. While it cannot take its lease, at start or after losing it,
// its error says why: "unavailable: starting: taking its lease: <the
// last attempt's error> (3 attempts failed)".
func (s *Service) Ready(ctx context.Context) error {
	if !s.ready.Load() {
		if s.draining.Load() {
			return fmt.Errorf("%w: draining", ErrUnavailable)
		}
		if r := s.opened.Load(); r != nil {
			if why := r.lease.takeFailure(); why != nil {
				return fmt.Errorf("%w: starting: %w", ErrUnavailable, why)
			}
		}
		return fmt.Errorf("%w: starting", ErrUnavailable)
	}
	if err := s.keys.ready(); err != nil {
		if why := s.keys.lease.takeFailure(); why != nil {
			return fmt.Errorf("%w: %w", err, why)
		}
		return err
	}
	return s.store.Ready(ctx)
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// httpHandler returns what the gateway's listener serves over HTTP: the
// probes, the API and Config.Static, each request past the HTTP edge's
// refusals (refuseTransferEncoding) and, under dev auth, refuseOtherHosts.
func (s *Service) httpHandler() http.Handler {
	mux := http.NewServeMux()
	handleProbes(mux, s.readyz(), s.gathered(), true)
	a := &api{
		nc: s.nc, cfg: &s.cfg, log: s.log, metrics: s.metrics,
		byAddr: s.apiByAddr, byUser: s.apiByUser,
		authz: s.authz, store: s.store, online: s.online,
		authenticate: s.authenticate, checkOrigin: s.checkOrigin,
		presenceOf: s.presenceOf, ready: s.ready.Load,
	}
	if s.apiKeys != nil {
		sa := &serverAPI{
			keys: s.apiKeys, byKey: s.apiByKey, byAddr: s.apiByAddr, log: s.log, metrics: s.metrics,
			store: s.store, events: s.keys.events, presenceOf: s.presenceOf, cfg: &s.cfg, ready: s.ready.Load,
		}
		sa.routes(mux, a.route)
	}
	a.routes(mux)
	if s.cfg.Static != nil {
		mux.Handle("/", s.cfg.Static)
	}
	return refuseTransferEncoding(s.refuseOtherHosts(mux))
}

// readyz is what /readyz asks: Config.Readyz, or Ready.
func (s *Service) readyz() func(context.Context) error {
	if s.cfg.Readyz != nil {
		return s.cfg.Readyz
	}
	return s.Ready
}

// gathered is what /metrics serves: Config.Metrics, or the gateway's
// registry.
func (s *Service) gathered() prometheus.Gatherer {
	if s.cfg.Metrics != nil {
		return s.cfg.Metrics
	}
	return s.reg
}

// answerWithin is how long an HTTP request may take to decide its answer:
// a NATS request's time, or a question to the app's, whichever is longer.
// What it waits for past that answers 503.
func (s *Service) answerWithin() time.Duration { return max(requestTimeout, s.cfg.AppTimeout) }

// withDeadline has h's requests decided within d: their context ends then.
func withDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}
