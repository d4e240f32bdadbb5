package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// ErrClosed is why a Client stopped when its Close was called.
var ErrClosed = errors.New("client closed")

// ErrRefused wraps why a Client stopped when the gateway refused it for
// good: a *HandshakeError (400, 401, 403 ...) or a *CloseError whose code
// says not to come back (1002, 1003, 1007, 1008, 1009).
var ErrRefused = errors.New("refused by the gateway")

// Limits of one subscribe or unsubscribe message (docs/protocol.md).
const (
	MaxSubscribeIDs = 100
	MaxMessageBytes = 4096
)

// Default timings of a Client.
const (
	DefaultDrainJitter  = time.Second
	DefaultStableAfter  = 10 * time.Second
	DefaultEventBuffer  = 256
	DefaultWriteTimeout = 10 * time.Second
	// DefaultHeartbeatInterval and DefaultTTL apply when a hello frame
	// carries no heartbeat_interval_ms or ttl_ms.
	DefaultHeartbeatInterval = 15 * time.Second
	DefaultTTL               = 30 * time.Second
)

// Config configures Connect. It says who the client is (Token, TokenFunc
// or User); every other field may be left zero.
type Config struct {
	// Token is a JWT proving the user, sent as Authorization: Bearer.
	Token string
	// TokenFunc, when set, is called before every connection attempt for a
	// fresh token, instead of Token. An error from it fails that attempt,
	// which is retried. With TokenFunc, a connection closed because its
	// token expired (1008 "token expired") is opened again with a new
	// token rather than given up.
	TokenFunc func(ctx context.Context) (string, error)
	// User is the user id on a gateway with dev auth (?user=), instead of
	// a token.
	User string
	// Device names this device in the user's own view (?device=): web,
	// ios, desktop, ...
	Device string
	// Header holds extra request headers (Origin).
	Header http.Header
	// LocalAddr is the local address to dial from.
	LocalAddr net.Addr
	// DialTimeout bounds one connection attempt: dial, upgrade and hello.
	// Zero means 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds one write to the socket. Zero means 10s.
	WriteTimeout time.Duration
	// KeepActive sends activity instead of heartbeat, so the user is never
	// made away automatically for lack of activity: for services and bots
	// that are present while they run. Without it, call Activity when the
	// person is active.
	KeepActive bool
	// Backoff bounds the waits between reconnect attempts.
	Backoff Backoff
	// DrainJitter bounds the random wait before reconnecting when the
	// gateway drains (close 1001); zero means 1s. The backoff starts over.
	DrainJitter time.Duration
	// StableAfter is how long a connection must have lasted for the
	// backoff to start over when it is lost; zero means 10s. A gateway
	// that accepts and drops at once is not hammered.
	StableAfter time.Duration
	// EventBuffer is the capacity of the Events channel; zero means 256.
	// Events that do not fit are dropped and counted (see Lagged).
	EventBuffer int
}

// withDefaults fills the zero fields of cfg and checks it.
func (cfg Config) withDefaults() (Config, error) {
	hasToken := cfg.Token != "" || cfg.TokenFunc != nil
	switch {
	case !hasToken && cfg.User == "":
		return cfg, errors.New("no identity: set Token, TokenFunc or User")
	case hasToken && cfg.User != "":
		return cfg, errors.New("set a token or User (dev auth), not both")
	case cfg.User != "" && !presence.ValidUserID(cfg.User):
		return cfg, fmt.Errorf("user id %q: want 1 to %d characters of A-Z a-z 0-9 _ -", cfg.User, presence.MaxUserIDLen)
	case cfg.Device != "" && !presence.ValidDevice(cfg.Device):
		return cfg, fmt.Errorf("device %q: want 1 to %d characters of A-Z a-z 0-9 _ - . and space", cfg.Device, presence.MaxDeviceLen)
	case cfg.DialTimeout < 0, cfg.WriteTimeout < 0, cfg.DrainJitter < 0, cfg.StableAfter < 0:
		return cfg, errors.New("timeouts and waits must not be negative")
	case cfg.EventBuffer < 0:
		return cfg, fmt.Errorf("event buffer %d is negative", cfg.EventBuffer)
	}
	var err error
	if cfg.Backoff, err = cfg.Backoff.withDefaults(); err != nil {
		return cfg, err
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.DrainJitter == 0 {
		cfg.DrainJitter = DefaultDrainJitter
	}
	if cfg.StableAfter == 0 {
		cfg.StableAfter = DefaultStableAfter
	}
	if cfg.EventBuffer == 0 {
		cfg.EventBuffer = DefaultEventBuffer
	}
	return cfg, nil
}

// gatewayURL returns the URL to dial: raw with the path /ws when it has
// none, and the user and device in the query.
func gatewayURL(raw string, cfg Config) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("bad url %q: %w", raw, err)
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("bad url %q: the scheme must be ws, wss, http or https", raw)
	}
	if u.Host == "" {
		return "", fmt.Errorf("bad url %q: no host", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/ws"
	}
	u.Fragment = ""
	q := u.Query()
	if cfg.User != "" {
		q.Set("user", cfg.User)
	}
	if cfg.Device != "" {
		q.Set("device", cfg.Device)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Client is a presence client that stays connected: it sends heartbeats,
// reconnects with backoff when the connection is lost, and then restores
// its chosen status, idle state and subscriptions. Its methods are safe
// for concurrent use. Connect returns one; Close ends it.
type Client struct {
	url    string
	cfg    Config
	events chan Event
	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	conn     *Conn // the open connection, nil while there is none
	hello    protocol.Hello
	status   presence.Status // chosen with SetStatus; "" for none
	idle     bool
	watched  map[string]struct{}
	all      bool
	presence map[string]presence.Presence
	self     protocol.Self
	seq      uint64
	err      error // why the client stopped; nil while it runs
	// Subscribes are paced, as the gateway refuses a subscribe when 16
	// requests of the socket wait: waiting holds the subscribes sent on the
	// open connection and not yet answered, at most subscribeWindow, and
	// backlog the subscribes and unsubscribes still to send, in order.
	waiting []protocol.ClientMessage
	backlog []protocol.ClientMessage
	// tokens is what the rate of requests leaves to send, as of refilled;
	// flushTimer, when set, sends the backlog once there are tokens again.
	tokens     float64
	refilled   time.Time
	flushTimer *time.Timer
	timers     sync.WaitGroup // the flushTimer's runs, scheduled or running

	heartbeats atomic.Uint64
	reconnects atomic.Uint64
	dropped    atomic.Uint64
	// lag counts the events dropped since the last one delivered. Only
	// the goroutine that emits (Connect, then run) touches it.
	lag uint64
}

// Connect opens a connection to the gateway at url (ws://host:port/ws, or
// its http form) and returns a Client that keeps it open until Close. It
// retries a failed attempt with backoff until ctx ends, and returns at
// once, wrapping ErrRefused, when the gateway refuses the client for good
// (a 401 or 403 upgrade refusal). ctx bounds only Connect.
func Connect(ctx context.Context, url string, cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	u, err := gatewayURL(url, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	c := &Client{
		url:      u,
		cfg:      cfg,
		events:   make(chan Event, cfg.EventBuffer),
		done:     make(chan struct{}),
		watched:  make(map[string]struct{}),
		presence: make(map[string]presence.Presence),
	}
	attempt := 0
	conn, err := c.open(ctx, 0, &attempt, nil)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.emit(Connected{c.attach(conn)})
	go c.run(conn)
	return c, nil
}

// Events returns the channel of events, in the order they happened. It is
// closed when the client stops; Err then says why. The caller should read
// it steadily: an event that finds the channel full is dropped, counted in
// Stats, and a Lagged event comes before the next one delivered. Reading
// never stalls the connection.
func (c *Client) Events() <-chan Event { return c.events }

// Done is closed when the client has stopped: after Close, or when the
// gateway refused it for good.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns nil while the client runs; then ErrClosed after Close, or
// an error wrapping ErrRefused and the refusal (a *HandshakeError or a
// *CloseError) when the gateway refused it for good.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close stops the client: it closes the connection (with close code 1000)
// or stops waiting to reconnect, and returns once every goroutine of the
// client has ended. It may be called more than once.
func (c *Client) Close() error {
	c.cancel()
	<-c.done
	return nil
}

// Hello returns the hello frame of the newest connection.
func (c *Client) Hello() protocol.Hello {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hello
}

// Connected reports whether a connection is open now.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil
}

// Stats counts what a Client did.
type Stats struct {
	// Heartbeats is how many heartbeat (or activity, with KeepActive)
	// messages it sent on its own.
	Heartbeats uint64
	// Reconnects is how many times a new connection replaced a lost one.
	Reconnects uint64
	// Dropped is how many events found the Events channel full.
	Dropped uint64
}

// Stats returns the counts so far.
func (c *Client) Stats() Stats {
	return Stats{Heartbeats: c.heartbeats.Load(), Reconnects: c.reconnects.Load(), Dropped: c.dropped.Load()}
}

// SetStatus chooses the user's status (online, away, busy or invisible),
// shared by all of their devices. It is sent now if a connection is open,
// and again after every reconnect.
func (c *Client) SetStatus(status presence.Status) error {
	st, err := presence.ParseChosen(string(status))
	if err != nil {
		return fmt.Errorf("set status: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("set status: %w", c.err)
	}
	c.status = st
	c.sendLocked(protocol.ClientMessage{Type: protocol.TypeSetStatus, Status: string(st)})
	return nil
}

// Status returns the status chosen with SetStatus, "" if none.
func (c *Client) Status() presence.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// Activity says the person is active on this device: an automatic away
// becomes online again. It ends Idle.
func (c *Client) Activity() error { return c.setIdle(false, protocol.TypeActivity) }

// Idle says the person is not looking at this device; when every device
// of the user is idle, the user is away automatically. It lasts, across
// reconnects, until Activity.
func (c *Client) Idle() error { return c.setIdle(true, protocol.TypeIdle) }

func (c *Client) setIdle(idle bool, typ string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("%s: %w", typ, c.err)
	}
	c.idle = idle
	c.sendLocked(protocol.ClientMessage{Type: typ})
	return nil
}

// Subscribe starts watching users. The gateway answers with a Snapshot of
// the allowed ones and a Denied per refused one; a denied user is no
// longer watched. The set of watched users is subscribed again after
// every reconnect. A bad user id is an error and nothing changes.
//
// Many ids are sent in several subscribe messages (at most
// MaxSubscribeIDs ids and MaxMessageBytes bytes each), of which a few at
// a time wait for their answer, as the gateway takes only so many at
// once. A ServerError with the id of one of them refused it: with code
// rate_limited or unavailable its users stay watched and are subscribed
// on the next connection, or when Subscribe is called again; with another
// code they are no longer watched.
func (c *Client) Subscribe(userIDs ...string) error {
	ids, err := checkIDs(userIDs)
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("subscribe: %w", c.err)
	}
	for _, id := range ids {
		c.watched[id] = struct{}{}
	}
	c.subscribeLocked(ids)
	return nil
}

// Unsubscribe stops watching users.
func (c *Client) Unsubscribe(userIDs ...string) error {
	ids, err := checkIDs(userIDs)
	if err != nil {
		return fmt.Errorf("unsubscribe: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("unsubscribe: %w", c.err)
	}
	for _, id := range ids {
		delete(c.watched, id)
		delete(c.presence, id)
	}
	for _, chunk := range chunks(ids, protocol.TypeUnsubscribe) {
		c.requestLocked(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, UserIDs: chunk})
	}
	return nil
}

// SubscribeAll watches every user (global presence), which the gateway
// allows only under its "everyone" policy; otherwise it answers with
// Denied for user "*".
func (c *Client) SubscribeAll() error { return c.setAll(true) }

// UnsubscribeAll ends SubscribeAll; users subscribed one by one stay
// watched.
func (c *Client) UnsubscribeAll() error { return c.setAll(false) }

func (c *Client) setAll(all bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("subscribe all: %w", c.err)
	}
	c.all = all
	if all {
		c.requestLocked(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: c.nextIDLocked(), All: true})
		return nil
	}
	for id := range c.presence {
		if _, ok := c.watched[id]; !ok {
			delete(c.presence, id)
		}
	}
	c.requestLocked(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, All: true})
	return nil
}

// Watched returns the users watched one by one (subscribed again after
// every reconnect), sorted.
func (c *Client) Watched() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]string, 0, len(c.watched))
	for id := range c.watched {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Presence returns the newest presence of a watched user the gateway told
// of, whatever events were dropped.
func (c *Client) Presence(userID string) (presence.Presence, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.presence[userID]
	return p, ok
}

// Self returns the newest self frame: the user's own true status and
// number of live connections.
func (c *Client) Self() protocol.Self {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.self
}

// checkIDs checks user ids and drops repeats, keeping their order.
func checkIDs(userIDs []string) ([]string, error) {
	if len(userIDs) == 0 {
		return nil, errors.New("no user ids")
	}
	seen := make(map[string]struct{}, len(userIDs))
	ids := make([]string, 0, len(userIDs))
	for _, id := range userIDs {
		if !presence.ValidUserID(id) {
			return nil, fmt.Errorf("user id %q: want 1 to %d characters of A-Z a-z 0-9 _ -", id, presence.MaxUserIDLen)
		}
		if _, ok := seen[id]; !ok {
			seen[id] = struct{}{}
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// chunks splits ids into lists one message of type typ takes: at most
// MaxSubscribeIDs ids and MaxMessageBytes bytes of JSON (ids are ASCII).
func chunks(ids []string, typ string) [][]string {
	overhead := len(`{"type":"","id":"s-00000000000000000000","user_ids":[]}`) + len(typ)
	var out [][]string
	var cur []string
	size := overhead
	for _, id := range ids {
		add := len(id) + 3 // quotes and comma
		if len(cur) > 0 && (len(cur) >= MaxSubscribeIDs || size+add > MaxMessageBytes) {
			out = append(out, cur)
			cur, size = nil, overhead
		}
		cur = append(cur, id)
		size += add
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// subscribeLocked sends subscribe messages for ids.
func (c *Client) subscribeLocked(ids []string) {
	for _, chunk := range chunks(ids, protocol.TypeSubscribe) {
		c.requestLocked(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: c.nextIDLocked(), UserIDs: chunk})
	}
}

// subscribeWindow is how many subscribes may wait for their answer at
// once: half of what the gateway takes, leaving room for the set_status
// messages that wait in the same queue.
const subscribeWindow = 8

// Subscribes and unsubscribes are sent at most requestRate a second after
// a burst of requestBurst: half of the gateway's default message rate
// limit, leaving the rest to heartbeats and status changes.
const (
	requestRate  = 10
	requestBurst = 20
)

// requestLocked queues a subscribe or unsubscribe for the open connection,
// after those before it, and sends what may go now.
func (c *Client) requestLocked(m protocol.ClientMessage) {
	if c.conn == nil {
		return
	}
	c.backlog = append(c.backlog, m)
	c.flushLocked()
}

// flushLocked sends the backlog's messages in order while the subscribes
// waiting for an answer and the rate leave room. When the rate stops it,
// a timer sends the rest later; an answer lets it go on (answeredLocked).
func (c *Client) flushLocked() {
	now := time.Now()
	c.tokens = min(requestBurst, c.tokens+now.Sub(c.refilled).Seconds()*requestRate)
	c.refilled = now
	for len(c.backlog) > 0 && c.conn != nil {
		next := c.backlog[0]
		if next.Type == protocol.TypeSubscribe && len(c.waiting) >= subscribeWindow {
			return
		}
		if c.tokens < 1 {
			if c.flushTimer == nil {
				wait := time.Duration((1 - c.tokens) / requestRate * float64(time.Second))
				c.timers.Add(1)
				c.flushTimer = time.AfterFunc(wait, c.flushLater)
			}
			return
		}
		c.tokens--
		c.backlog = c.backlog[1:]
		c.sendLocked(next)
		if next.Type == protocol.TypeSubscribe {
			c.waiting = append(c.waiting, next)
		}
	}
}

// flushLater is the timer's flush.
func (c *Client) flushLater() {
	defer c.timers.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushTimer = nil
	c.flushLocked()
}

// answeredLocked takes the answer to the subscribe with this id: it and
// the ones sent before it are done, and the backlog may go on. It returns
// the subscribe, and false when id is none of them.
func (c *Client) answeredLocked(id string) (protocol.ClientMessage, bool) {
	i := slices.IndexFunc(c.waiting, func(m protocol.ClientMessage) bool { return m.ID == id })
	if id == "" || i < 0 {
		return protocol.ClientMessage{}, false
	}
	m := c.waiting[i]
	c.waiting = slices.Delete(c.waiting, 0, i+1)
	c.flushLocked()
	return m, true
}

func (c *Client) nextIDLocked() string {
	c.seq++
	return "s-" + strconv.FormatUint(c.seq, 10)
}

// sendLocked sends m on the open connection, if there is one. A failed
// write is not an error of the caller: the connection is broken, and what
// m changed is sent again on the next one.
func (c *Client) sendLocked(m protocol.ClientMessage) {
	if c.conn != nil {
		_ = c.write(c.conn, m)
	}
}

// write sends m on conn within the write timeout.
func (c *Client) write(conn *Conn, m protocol.ClientMessage) error {
	_ = conn.NetConn().SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
	return conn.Send(m)
}

// dial makes one connection attempt.
func (c *Client) dial(ctx context.Context) (*Conn, error) {
	o := Options{Header: c.cfg.Header.Clone(), LocalAddr: c.cfg.LocalAddr, Timeout: c.cfg.DialTimeout}
	token := c.cfg.Token
	if c.cfg.TokenFunc != nil {
		var err error
		if token, err = c.cfg.TokenFunc(ctx); err != nil {
			return nil, fmt.Errorf("get token: %w", err)
		}
		if token == "" {
			return nil, errors.New("get token: the token func returned an empty token")
		}
	}
	if token != "" {
		if o.Header == nil {
			o.Header = make(http.Header)
		}
		o.Header.Set("Authorization", "Bearer "+token)
	}
	return Dial(ctx, c.url, o)
}

// open makes connection attempts until one succeeds, ctx ends or the
// gateway refuses for good. It waits wait before the first, and a backoff
// delay before each later one, counted by *attempt. notify, when set, is
// told of every failed attempt.
func (c *Client) open(ctx context.Context, wait time.Duration, attempt *int, notify func(Disconnected)) (*Conn, error) {
	var last error
	for failed := 0; ; {
		if err := sleep(ctx, wait); err != nil {
			if last != nil {
				return nil, fmt.Errorf("%w; last attempt: %w", err, last)
			}
			return nil, err
		}
		conn, err := c.dial(ctx)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w; last attempt: %w", ctx.Err(), err)
		}
		if c.permanent(err) {
			return nil, fmt.Errorf("%w: %w", ErrRefused, err)
		}
		last = err
		failed++
		wait = c.cfg.Backoff.Delay(*attempt)
		*attempt++
		if notify != nil {
			notify(Disconnected{Err: err, Retry: wait, Attempt: failed})
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// permanent reports whether err means the gateway refuses this client for
// good, so that trying again is pointless: an upgrade refused with a 4xx
// status other than 408 and 429, or a close code for a broken client or a
// policy violation. A token that expired while connected is not permanent
// when TokenFunc can give a new one.
func (c *Client) permanent(err error) bool {
	var he *HandshakeError
	if errors.As(err, &he) {
		switch {
		case he.Status == http.StatusRequestTimeout, he.Status == http.StatusTooManyRequests:
			return false
		case he.Status >= 500:
			return false
		}
		return true
	}
	var ce *CloseError
	if errors.As(err, &ce) {
		switch ce.Code {
		case ws.StatusProtocolError, ws.StatusUnsupportedData, ws.StatusInvalidFramePayloadData, ws.StatusMessageTooBig:
			return true
		case ws.StatusPolicyViolation:
			return c.cfg.TokenFunc == nil || ce.Reason != "token expired"
		}
	}
	return false
}

// attach makes conn the open connection: it sends the chosen status, the
// idle state and the subscriptions again, and returns the hello.
func (c *Client) attach(conn *Conn) protocol.Hello {
	h := hello(conn.Hello)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hello = h
	c.conn = conn
	if c.status != "" {
		c.sendLocked(protocol.ClientMessage{Type: protocol.TypeSetStatus, Status: string(c.status)})
	}
	if c.idle {
		c.sendLocked(protocol.ClientMessage{Type: protocol.TypeIdle})
	}
	if c.all {
		c.requestLocked(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: c.nextIDLocked(), All: true})
	}
	if len(c.watched) > 0 {
		ids := make([]string, 0, len(c.watched))
		for id := range c.watched {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		c.subscribeLocked(ids)
	}
	return h
}

// run keeps the client connected until Close or a permanent refusal,
// starting with conn.
func (c *Client) run(conn *Conn) {
	defer close(c.done)
	attempt := 0
	for {
		opened := time.Now()
		err := c.serve(conn)
		c.mu.Lock()
		c.conn, c.waiting, c.backlog = nil, nil, nil
		if c.flushTimer != nil && c.flushTimer.Stop() {
			c.timers.Done()
		}
		c.flushTimer = nil
		c.mu.Unlock()
		_ = conn.Abort()
		if c.ctx.Err() != nil {
			c.stop(ErrClosed)
			return
		}
		if c.permanent(err) {
			c.stop(fmt.Errorf("%w: %w", ErrRefused, err))
			return
		}
		lost := time.Now()
		var wait time.Duration
		if ce := (*CloseError)(nil); errors.As(err, &ce) && ce.Code == ws.StatusGoingAway {
			// The gateway drains: come back soon, but not all at once.
			attempt = 0
			wait = time.Duration(rand.Int64N(int64(c.cfg.DrainJitter)))
		} else {
			if lost.Sub(opened) >= c.cfg.StableAfter {
				attempt = 0
			}
			wait = c.cfg.Backoff.Delay(attempt)
			attempt++
		}
		c.emit(Disconnected{Err: err, Retry: wait})
		tries := 1
		conn, err = c.open(c.ctx, wait, &attempt, func(d Disconnected) {
			tries++
			c.emit(d)
		})
		if err != nil {
			if c.ctx.Err() != nil {
				err = ErrClosed
			}
			c.stop(err)
			return
		}
		c.reconnects.Add(1)
		c.emit(Reconnected{Hello: c.attach(conn), Attempts: tries, Down: time.Since(lost)})
	}
}

// stop records why the client stopped and closes Events.
func (c *Client) stop(err error) {
	c.timers.Wait()
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	if c.lag > 0 {
		select {
		case c.events <- Lagged{Dropped: c.lag}:
		default:
		}
	}
	close(c.events)
}

// timings returns the heartbeat interval a hello asks for, and how long
// the gateway may stay silent before the connection counts as dead: its
// TTL, at least two intervals, plus an interval of slack.
func timings(h protocol.Hello) (every, silence time.Duration) {
	every = DefaultHeartbeatInterval
	if h.HeartbeatIntervalMS > 0 {
		every = time.Duration(h.HeartbeatIntervalMS) * time.Millisecond
	}
	ttl := DefaultTTL
	if h.TTLMS > 0 {
		ttl = time.Duration(h.TTLMS) * time.Millisecond
	}
	return every, max(ttl, 2*every) + every
}

// serve reads conn's frames and delivers them as events, while a
// goroutine sends the heartbeats, until the connection ends or the client
// is closed. It returns why the connection ended.
func (c *Client) serve(conn *Conn) error {
	every, silence := timings(c.Hello())
	nc := conn.NetConn()
	var last atomic.Int64 // when a frame last came, in Unix nanoseconds
	conn.onFrame = func() {
		now := time.Now()
		last.Store(now.UnixNano())
		_ = nc.SetReadDeadline(now.Add(silence))
	}
	conn.onFrame()
	closed := make(chan struct{})
	stopClose := context.AfterFunc(c.ctx, func() {
		defer close(closed)
		_ = conn.Close()
	})
	defer func() {
		if !stopClose() {
			<-closed
		}
	}()
	beating := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { c.beat(conn, every, &last, beating) })
	defer func() {
		close(beating)
		wg.Wait()
	}()
	for {
		m, _, err := conn.Read()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && c.ctx.Err() == nil {
				return fmt.Errorf("the gateway was silent for %v: %w", silence, err)
			}
			return err
		}
		c.deliver(m)
	}
}

// beat sends a heartbeat (or activity) every interval until stop is
// closed, and a ping when no frame came for an interval, whose pong
// shows the gateway is still there. A failed write aborts conn, which
// ends serve.
func (c *Client) beat(conn *Conn, every time.Duration, last *atomic.Int64, stop <-chan struct{}) {
	msg := protocol.ClientMessage{Type: protocol.TypeHeartbeat}
	if c.cfg.KeepActive {
		msg.Type = protocol.TypeActivity
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if err := c.write(conn, msg); err != nil {
			_ = conn.Abort()
			return
		}
		c.heartbeats.Add(1)
		if time.Since(time.Unix(0, last.Load())) >= every {
			_ = conn.NetConn().SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
			if err := conn.SendRaw(ws.OpPing, nil); err != nil {
				_ = conn.Abort()
				return
			}
		}
	}
}

// deliver records what a server message says and emits its event.
func (c *Client) deliver(m protocol.ServerMessage) {
	ev, ok := serverEvent(m)
	if !ok {
		return
	}
	c.mu.Lock()
	switch ev := ev.(type) {
	case Snapshot:
		c.answeredLocked(ev.ID)
		c.notedLocked(ev.Users)
	case Changes:
		c.notedLocked(ev.Updates)
	case Self:
		c.self = ev.Self
	case ServerError:
		if m, ok := c.answeredLocked(ev.ID); ok && !transient(ev.Code) {
			// The subscribe was refused as a whole, for good: its users
			// are not watched.
			c.unwatchLocked(m)
		}
	case Denied:
		if ev.UserID == "*" {
			c.all = false
		} else {
			delete(c.watched, ev.UserID)
			delete(c.presence, ev.UserID)
		}
	}
	c.mu.Unlock()
	c.emit(ev)
}

// transient reports whether an error code means a request may succeed
// when sent again.
func transient(code string) bool {
	return code == protocol.CodeRateLimited || code == protocol.CodeUnavailable
}

// unwatchLocked stops watching the users of the subscribe m.
func (c *Client) unwatchLocked(m protocol.ClientMessage) {
	if m.All {
		c.all = false
	}
	for _, id := range m.UserIDs {
		delete(c.watched, id)
		delete(c.presence, id)
	}
}

// notedLocked records the presence of the watched users in list.
func (c *Client) notedLocked(list []presence.Presence) {
	for _, p := range list {
		if _, ok := c.watched[p.UserID]; ok || c.all {
			c.presence[p.UserID] = p
		}
	}
}

// emit delivers ev without blocking: when the channel is full, ev is
// dropped and counted, and a Lagged event goes before the next one that
// fits.
func (c *Client) emit(ev Event) {
	if c.lag > 0 {
		select {
		case c.events <- Lagged{Dropped: c.lag}:
			c.lag = 0
		default:
			c.lag++
			c.dropped.Add(1)
			return
		}
	}
	select {
	case c.events <- ev:
	default:
		c.lag++
		c.dropped.Add(1)
	}
}
