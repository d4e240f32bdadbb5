// Package systest runs a whole greendot system in one test process: an
// embedded NATS server with JetStream, a reaper, a fanout and one or more
// gateways on loopback listeners, each process kind over its own NATS
// connection, as in production (assembled by package system). Tests talk to
// it with real WebSocket clients (package client) and the HTTP API.
//
// It is the harness of greendot's own tests, not an interface of the
// product: it changes with them.
package systest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/testlog"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/system"
	"github.com/greendot/greendot/webhook"
)

// Options configures a System. Zero timing fields get fast test values.
type Options struct {
	Gateway gateway.Config
	Reaper  reaper.Config
	Fanout  fanout.Config
	// NoReaper and NoFanout leave those processes out; start them with
	// StartReaper and StartFanout.
	NoReaper, NoFanout bool
	// Server, when set, is used instead of starting a NATS server.
	Server *server.Server
}

// Fast timings, for tests that wait for expiry.
const (
	TTL          = time.Second
	Heartbeat    = 300 * time.Millisecond
	Grace        = time.Second
	Batch        = 10 * time.Millisecond
	EventTimeout = 5 * time.Second
)

// System is a running greendot.
type System struct {
	tb     testing.TB
	opts   Options
	sys    *system.System
	Server *server.Server
	// NC is an operator's NATS connection; Store uses it.
	NC    *nats.Conn
	Store *presence.Store

	mu       sync.Mutex
	Gateways []*Gateway
	reaper   *system.Proc
	fanout   *system.Proc
}

// Gateway is a running gateway.
type Gateway struct {
	*gateway.Service
	// Addr is its listen address (host:port); URL its ws:// URL base and
	// HTTP its http:// base.
	Addr, WS, HTTP string
	proc           *system.Gateway
}

// stopTimeout bounds the wait for a service to return after its stop.
const stopTimeout = 30 * time.Second

// readyTimeout bounds the wait for a gateway to be ready.
const readyTimeout = 30 * time.Second

// Start runs a system that stops when the test ends.
func Start(tb testing.TB, opts Options) *System {
	tb.Helper()
	g := &opts.Gateway
	if g.ConnTTL == 0 {
		g.ConnTTL = TTL
	}
	if g.HeartbeatInterval == 0 {
		g.HeartbeatInterval = Heartbeat
	}
	if g.OfflineGrace == 0 {
		g.OfflineGrace = Grace
	}
	if g.BatchInterval == 0 {
		g.BatchInterval = Batch
	}
	if g.Tokens == nil {
		g.DevAuth = true
	}
	// The services' lines are shown with a test that fails.
	log := testlog.New(tb)
	if g.Logger == nil {
		g.Logger = log
	}
	if opts.Reaper.Logger == nil {
		opts.Reaper.Logger = log
	}
	if opts.Fanout.Logger == nil {
		opts.Fanout.Logger = log
	}
	so := system.Options{
		Name:        "systest",
		Logger:      log,
		StopTimeout: stopTimeout,
		// Tests that restart or cut NATS want services back quickly.
		NATSOptions: []nats.Option{nats.ReconnectWait(50 * time.Millisecond), nats.ReconnectJitter(100*time.Millisecond, time.Second)},
	}
	if opts.Server != nil {
		so.URL = opts.Server.ClientURL()
	} else {
		so.NATS = &system.NATSConfig{StoreDir: tb.TempDir()}
	}
	sys, err := system.Start(so)
	if err != nil {
		tb.Fatalf("start system: %v", err)
	}
	s := &System{tb: tb, opts: opts, sys: sys, Server: opts.Server}
	if s.Server == nil {
		s.Server = sys.NATS()
	}
	tb.Cleanup(s.stopAll)
	if s.NC, err = sys.Connect("operator"); err != nil {
		tb.Fatalf("connect to nats: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := presence.Open(ctx, s.NC, opts.Gateway.Buckets)
	if err != nil {
		tb.Fatalf("open buckets: %v", err)
	}
	s.Store = store
	if !opts.NoReaper {
		s.StartReaper()
	}
	if !opts.NoFanout {
		s.StartFanout()
	}
	s.StartGateway(opts.Gateway)
	return s
}

// stopAll stops the system: its gateways, then its reaper and fanout,
// then its NATS connections and server.
func (s *System) stopAll() {
	if err := s.sys.Stop(); err != nil {
		s.tb.Errorf("system stopped with error: %v", err)
	}
}

// stop stops one service.
func (s *System) stop(p *system.Proc) {
	s.tb.Helper()
	if err := p.Stop(stopTimeout); err != nil {
		s.tb.Errorf("service stopped with error: %v", err)
	}
}

// StartReaper starts a reaper (another one, if one runs).
func (s *System) StartReaper() {
	s.tb.Helper()
	p, err := s.sys.StartReaper("reaper", s.opts.Reaper)
	if err != nil {
		s.tb.Fatalf("start reaper: %v", err)
	}
	s.replace(&s.reaper, p)
	// Ready once its start-up sweep is over: a test's keys of leases that
	// are not there (another gateway's, made up) are not swept meanwhile.
	if err := p.AwaitReady(context.Background(), readyTimeout); err != nil {
		s.tb.Fatal(err)
	}
}

// StopReaper stops the reaper.
func (s *System) StopReaper() {
	s.tb.Helper()
	s.replace(&s.reaper, nil)
}

// StartFanout starts the fanout, replacing a running one.
func (s *System) StartFanout() {
	s.tb.Helper()
	p, err := s.sys.StartFanout("fanout", s.opts.Fanout)
	if err != nil {
		s.tb.Fatalf("start fanout: %v", err)
	}
	s.replace(&s.fanout, p)
	if err := p.AwaitReady(context.Background(), readyTimeout); err != nil {
		s.tb.Fatal(err)
	}
}

// StartWebhooks creates the stream presence_feed, as an operator does, if
// it is missing, and starts a webhooks process with cfg (a quiet logger
// unless it has one), which the system stops with the others or which its
// Stop stops earlier.
func (s *System) StartWebhooks(cfg webhook.Config) *system.Proc {
	s.tb.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testlog.New(s.tb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := presence.EnsureFeed(ctx, s.Store.JetStream(), cfg.Buckets, 0); err != nil {
		s.tb.Fatalf("create %s: %v", presence.FeedStream, err)
	}
	p, err := s.sys.StartWebhooks("webhooks", cfg)
	if err != nil {
		s.tb.Fatalf("start webhooks: %v", err)
	}
	return p
}

// StopFanout stops the fanout.
func (s *System) StopFanout() {
	s.tb.Helper()
	s.replace(&s.fanout, nil)
}

// replace puts p (nil for none) in slot, under s.mu, and stops the
// process it held.
func (s *System) replace(slot **system.Proc, p *system.Proc) {
	s.mu.Lock()
	old := *slot
	*slot = p
	s.mu.Unlock()
	if old != nil {
		s.stop(old)
	}
}

// StartGateway starts one more gateway with cfg (timings default to the
// system's), on a free loopback port.
func (s *System) StartGateway(cfg gateway.Config) *Gateway {
	s.tb.Helper()
	return s.StartGatewayAt(cfg, "127.0.0.1:0")
}

// StartGatewayAt starts a gateway like StartGateway, listening on addr:
// the address of a stopped gateway, to restart it where its clients
// reconnect.
func (s *System) StartGatewayAt(cfg gateway.Config, addr string) *Gateway {
	s.tb.Helper()
	base := s.opts.Gateway
	if cfg.ConnTTL == 0 {
		cfg.ConnTTL = base.ConnTTL
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = base.HeartbeatInterval
	}
	if cfg.OfflineGrace == 0 {
		cfg.OfflineGrace = base.OfflineGrace
	}
	if cfg.BatchInterval == 0 {
		cfg.BatchInterval = base.BatchInterval
	}
	if cfg.Tokens == nil && !cfg.DevAuth {
		cfg.DevAuth = base.DevAuth
		cfg.Tokens = base.Tokens
	}
	if cfg.Logger == nil {
		cfg.Logger = base.Logger
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.tb.Fatalf("listen on %s: %v", addr, err)
	}
	p, err := s.sys.StartGateway("gateway", cfg, ln)
	if err != nil {
		s.tb.Fatalf("start gateway: %v", err)
	}
	g := &Gateway{Service: p.Service, Addr: p.Addr, WS: p.WS, HTTP: p.HTTP, proc: p}
	s.mu.Lock()
	s.Gateways = append(s.Gateways, g)
	s.mu.Unlock()
	if err := p.AwaitReady(context.Background(), readyTimeout); err != nil {
		s.tb.Fatal(err)
	}
	return g
}

// Gateway returns the first gateway.
func (s *System) Gateway() *Gateway {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Gateways[0]
}

// StopGateway stops g cleanly: its sockets are closed with 1001.
func (s *System) StopGateway(g *Gateway) {
	s.tb.Helper()
	s.mu.Lock()
	for i, x := range s.Gateways {
		if x == g {
			s.Gateways = append(s.Gateways[:i], s.Gateways[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	s.stop(g.proc.Proc)
}

// Dial connects user to gateway g with dev auth, and an optional device.
func (s *System) Dial(g *Gateway, user string, device ...string) *client.Conn {
	s.tb.Helper()
	url := g.WS + "?user=" + user
	if len(device) > 0 {
		url += "&device=" + device[0]
	}
	c, err := client.Dial(context.Background(), url, client.Options{})
	if err != nil {
		s.tb.Fatalf("dial %s as %s: %v", g.Addr, user, err)
	}
	s.tb.Cleanup(func() { _ = c.Abort() })
	return c
}

// Follow records that a follows b.
func (s *System) Follow(a, b string) {
	s.tb.Helper()
	if err := s.Store.Follow(context.Background(), a, b); err != nil {
		s.tb.Fatalf("follow %s -> %s: %v", a, b, err)
	}
}

// Mutual makes every pair of users follow each other.
func (s *System) Mutual(users ...string) {
	s.tb.Helper()
	for _, a := range users {
		for _, b := range users {
			if a != b {
				s.Follow(a, b)
			}
		}
	}
}

// Next reads c's next message, failing the test after timeout.
func Next(tb testing.TB, c *client.Conn, timeout time.Duration) protocol.ServerMessage {
	tb.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	m, raw, err := c.Read()
	if err != nil {
		tb.Fatalf("read: %v (%s)", err, raw)
	}
	return m
}

// Await reads c's messages until match returns true for one, and returns
// it. Messages before it are discarded. It fails the test after timeout.
func Await(tb testing.TB, c *client.Conn, timeout time.Duration, what string, match func(protocol.ServerMessage) bool) protocol.ServerMessage {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	_ = c.SetReadDeadline(deadline)
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	var seen []string
	for {
		m, raw, err := c.Read()
		if err != nil {
			tb.Fatalf("waiting for %s: %v; seen: %v", what, err, seen)
		}
		if match(m) {
			return m
		}
		seen = append(seen, string(raw))
		if len(seen) > 20 {
			seen = seen[1:]
		}
	}
}

// AwaitStatus waits until c receives a presence_init or presence_batch
// saying user has status, and returns that presence object.
func AwaitStatus(tb testing.TB, c *client.Conn, user string, status presence.Status) presence.Presence {
	tb.Helper()
	var got presence.Presence
	Await(tb, c, EventTimeout, fmt.Sprintf("%s %s", user, status), func(m protocol.ServerMessage) bool {
		list := m.Updates
		if m.Type == protocol.TypePresenceInit {
			list = m.Users
		}
		for _, p := range list {
			if p.UserID == user && p.Status == status {
				got = p
				return true
			}
		}
		return false
	})
	return got
}

// AwaitSelf waits until c receives a self frame with status and devices.
func AwaitSelf(tb testing.TB, c *client.Conn, status presence.Status, devices int) {
	tb.Helper()
	Await(tb, c, EventTimeout, fmt.Sprintf("self %s/%d", status, devices), func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeSelf && m.Status == status && m.Devices == devices
	})
}

// KeepAlive sends heartbeats on c every interval until the returned
// function is called.
func KeepAlive(c *client.Conn, interval time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := c.Heartbeat(); err != nil {
					return
				}
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// StatusOf reads a user's status record.
func (s *System) StatusOf(user string) (presence.Record, error) {
	rec, _, err := s.Store.Status(context.Background(), user)
	if errors.Is(err, presence.ErrNotFound) {
		return presence.Record{Status: presence.Offline, Public: presence.Offline}, nil
	}
	return rec, err
}

// View follows what one socket has been told: the newest presence of every
// user from presence_init and presence_batch frames, and its own state from
// self frames. Unlike AwaitStatus, a View remembers what earlier frames
// said, so waiting for two users that changed in one batch works.
type View struct {
	tb    testing.TB
	c     *client.Conn
	users map[string]presence.Presence
	self  protocol.ServerMessage
	// Frames holds every frame read, in order.
	Frames []protocol.ServerMessage
}

// NewView returns a View of c.
func NewView(tb testing.TB, c *client.Conn) *View {
	return &View{tb: tb, c: c, users: make(map[string]presence.Presence)}
}

// Presence returns the newest presence of user the socket was told.
func (v *View) Presence(user string) (presence.Presence, bool) {
	p, ok := v.users[user]
	return p, ok
}

func (v *View) take(m protocol.ServerMessage) {
	v.Frames = append(v.Frames, m)
	switch m.Type {
	case protocol.TypePresenceInit:
		for _, p := range m.Users {
			v.users[p.UserID] = p
		}
	case protocol.TypePresenceBatch:
		for _, p := range m.Updates {
			v.users[p.UserID] = p
		}
	case protocol.TypeSelf:
		v.self = m
	}
}

// Until reads frames until cond holds, failing the test after timeout.
func (v *View) Until(timeout time.Duration, what string, cond func(*View) bool) {
	v.tb.Helper()
	if cond(v) {
		return
	}
	deadline := time.Now().Add(timeout)
	_ = v.c.SetReadDeadline(deadline)
	defer func() { _ = v.c.SetReadDeadline(time.Time{}) }()
	for {
		m, raw, err := v.c.Read()
		if err != nil {
			v.tb.Fatalf("waiting for %s: %v (%s); view: %v", what, err, raw, v.users)
		}
		v.take(m)
		if cond(v) {
			return
		}
	}
}

// Await waits until the socket was told user has status.
func (v *View) Await(user string, status presence.Status) presence.Presence {
	v.tb.Helper()
	v.Until(EventTimeout, fmt.Sprintf("%s %s", user, status), func(v *View) bool {
		return v.users[user].Status == status
	})
	return v.users[user]
}

// AwaitSelf waits until the socket was told its user's status and device
// count.
func (v *View) AwaitSelf(status presence.Status, devices int) {
	v.tb.Helper()
	v.Until(EventTimeout, fmt.Sprintf("self %s/%d", status, devices), func(v *View) bool {
		return v.self.Status == status && v.self.Devices == devices
	})
}
