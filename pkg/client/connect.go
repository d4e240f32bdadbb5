package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// ErrClosed is why a Client stopped when its Close was called.
var ErrClosed = errors.New("client closed")

// ErrRefused wraps why a Client stopped when the gateway refused it for
// good: a *HandshakeError (400, 401, 403 ...) or a *CloseError whose code
// says not to come back (1002, 1003, 1007, 1008, 1009).
var ErrRefused = errors.New("refused by the gateway")

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

	mu     sync.Mutex
	conn   *Conn // the open connection, nil while there is none
	hello  protocol.Hello
	status presence.Status // chosen with SetStatus; "" for none
	// statusSent reports that status was sent and no Self frame has
	// confirmed it yet: the Self frames before the confirmation show an
	// earlier status, not another device's choice.
	statusSent bool
	// custom is a custom status set with SetCustomStatus (nil: cleared)
	// that no Self frame has shown yet, while customPending: it is sent
	// again on the next connection.
	custom        *presence.Custom
	customPending bool
	idle          bool
	// activitySent is when an activity last went on the open connection,
	// and activityDue says one more was asked for since, which goes with
	// the next heartbeat in its place (Activity).
	activitySent time.Time
	activityDue  bool
	watched      map[string]struct{}
	all          bool
	presence     map[string]presence.Presence
	rooms        map[string]*room // joined, by room id
	self         protocol.Self
	seq          uint64
	err          error // why the client stopped; nil while it runs
	// token is the token of later connections without TokenFunc:
	// Config.Token, or the newest SetToken gave. life is that of the
	// newest token sent on the open connection, which TokenFunc renews
	// in place, and tokenSet tells the renewal that SetToken sent one
	// (renew.go).
	token    string
	life     tokenLife
	tokenSet chan struct{}
	// Requests (subscribe, unsubscribe, join, room_update, leave) are
	// paced, as the gateway refuses one when 16 requests of the socket
	// wait (requests.go): waiting holds those sent on the open connection
	// whose handling the client has not seen yet, and backlog those still
	// to send, in order.
	waiting []sentRequest
	backlog []protocol.ClientMessage
	// tokens is what the rate of requests leaves to send, as of refilled;
	// flushTimer, when set, sends the backlog once the rate, the requests
	// waiting or a refusal's backoff let it go on.
	tokens     float64
	refilled   time.Time
	flushTimer *time.Timer
	timers     sync.WaitGroup // the flushTimer's runs, scheduled or running
	// retryAt holds the backlog after a refusal (rate_limited) until then;
	// refusals counts the refusals in a row, for the backoff.
	retryAt  time.Time
	refusals int

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
		rooms:    make(map[string]*room),
		token:    cfg.Token,
		tokenSet: make(chan struct{}, 1),
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
	// A choice the user already has is not confirmed by a Self frame.
	c.status, c.statusSent = st, c.self.Status != st
	c.sendLocked(protocol.ClientMessage{Type: protocol.TypeSetStatus, Status: string(st)})
	return nil
}

// SetCustomStatus sets the user's custom status for all of their
// devices (nil clears it): at once when a connection is open, else on
// the next one, and again on later ones until the gateway confirms it
// (a Self event carries it). A custom status the gateway would refuse
// (presence.ParseCustom) is refused here, wrapping
// presence.ErrInvalidCustom.
func (c *Client) SetCustomStatus(custom *presence.Custom) error {
	if custom != nil {
		var err error
		if custom, err = presence.ParseCustom(custom.Text, custom.Emoji, custom.ExpiresAt, time.Now()); err != nil {
			return fmt.Errorf("set custom status: %w", err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("set custom status: %w", c.err)
	}
	// One the user already has is not confirmed by a Self frame.
	c.custom, c.customPending = custom, !c.self.Custom.Equal(custom)
	c.sendLocked(customMessage(custom))
	return nil
}

// customMessage returns the set_custom_status message of custom.
func customMessage(custom *presence.Custom) protocol.ClientMessage {
	m := protocol.ClientMessage{Type: protocol.TypeSetCustom}
	if custom != nil {
		m.Text, m.Emoji, m.ExpiresAt = custom.Text, custom.Emoji, custom.ExpiresAt
	}
	return m
}

// Status returns the status chosen with SetStatus, or since then on
// another device of the user (not away); "" if none.
func (c *Client) Status() presence.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// Activity says the person is active on this device: an automatic away
// becomes online again. It ends Idle. It may be called on every input
// event: an activity is sent at once when the person was idle or none was
// sent within the heartbeat interval, and otherwise with the next
// heartbeat, in its place, so that the calls never add up to more
// messages than the gateway takes.
func (c *Client) Activity() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("%s: %w", protocol.TypeActivity, c.err)
	}
	every, _ := timings(c.hello)
	if now := time.Now(); c.idle || now.Sub(c.activitySent) >= every {
		c.idle, c.activityDue, c.activitySent = false, false, now
		c.sendLocked(protocol.ClientMessage{Type: protocol.TypeActivity})
		return nil
	}
	c.activityDue = true
	return nil
}

// Idle says the person is not looking at this device; when every device
// of the user is idle, the user is away automatically. It lasts, across
// reconnects, until Activity.
func (c *Client) Idle() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("%s: %w", protocol.TypeIdle, c.err)
	}
	c.idle, c.activityDue = true, false
	c.sendLocked(protocol.ClientMessage{Type: protocol.TypeIdle})
	return nil
}

// sendDueActivity sends on conn the activity that Activity left for the
// heartbeat, if one is due, and reports whether it did, with the write's
// error.
func (c *Client) sendDueActivity(conn *Conn) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.activityDue || c.conn != conn {
		return false, nil
	}
	c.activityDue, c.activitySent = false, time.Now()
	return true, c.write(conn, protocol.ClientMessage{Type: protocol.TypeActivity})
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
// rate_limited (too many requests waited) the client sends it again
// shortly, for the users still watched; with unavailable its users stay
// watched and are subscribed on the next connection, or when Subscribe is
// called again; with another code they are no longer watched.
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
	// An id, though unsubscribe has no answer, lets a refusal of it be
	// told, and the unsubscribe sent again.
	for _, chunk := range chunks(ids, protocol.TypeUnsubscribe) {
		c.requestLocked(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, ID: c.nextIDLocked(), UserIDs: chunk})
	}
	return nil
}

// SubscribeAll watches every user (global presence), which the gateway
// allows only under its "everyone" policy; otherwise it answers with
// Denied for user "*". Its Snapshot lists the users online (up to the
// gateway's limit), and Changes follow; Presence has the users of the
// newest such Snapshot and of the changes since, so a user who went
// offline while the client reconnected is no longer there.
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
	c.requestLocked(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, ID: c.nextIDLocked(), All: true})
	return nil
}

// Watched returns the users watched one by one (subscribed again after
// every reconnect), sorted.
func (c *Client) Watched() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.watched))
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

// sendLocked sends m on the open connection, if there is one. A failed
// write is not an error of the caller: the connection is broken (a write
// that timed out may have left part of a frame), so it is ended, and what
// m changed is sent again on the next one.
func (c *Client) sendLocked(m protocol.ClientMessage) {
	if c.conn != nil {
		if err := c.write(c.conn, m); err != nil {
			_ = c.conn.Abort()
		}
	}
}

// write sends m on conn within the write timeout.
func (c *Client) write(conn *Conn, m protocol.ClientMessage) error {
	_ = conn.NetConn().SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
	return conn.Send(m)
}
