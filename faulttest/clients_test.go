package faulttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// sighting is one presence a socket was told, and when it read it.
type sighting struct {
	at time.Time
	p  presence.Presence
}

// closeEvent is the end of one of a client's sockets.
type closeEvent struct {
	at   time.Time
	code int // the close code, 0 when the socket ended without a close frame
	url  string
}

// liveClient is a user's WebSocket that sends heartbeats and records
// everything it is told, on goroutines of its own. With move set, a 1001
// close makes it reconnect to the next gateway URL and subscribe again, as
// the protocol asks of clients of a draining gateway.
type liveClient struct {
	tb        testing.TB
	user      string
	urls      []string
	move      bool
	heartbeat time.Duration

	mu     sync.Mutex
	conn   *client.Conn
	at     int // index in urls of the gateway connected to
	subs   []string
	seen   map[string][]sighting
	selfs  []protocol.ServerMessage
	errs   []protocol.ServerMessage
	inits  map[string]bool
	closes []closeEvent
	moves  []time.Time // when it was connected again after a 1001
	ended  bool        // the test closed or aborted it
	nextID int

	stop chan struct{}
	wg   sync.WaitGroup
}

// dialTimeout bounds one WebSocket dial, hello frame included.
const dialTimeout = 15 * time.Second

// dialClient connects user to urls[0], failing the test if it cannot.
func dialClient(tb testing.TB, user string, urls []string, heartbeat time.Duration, move bool) *liveClient {
	tb.Helper()
	c, err := tryDialClient(tb, user, urls, heartbeat, move, dialTimeout)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// tryDialClient connects user to urls[0], retrying refused upgrades (a
// gateway that cannot reach NATS answers 503) until timeout.
func tryDialClient(tb testing.TB, user string, urls []string, heartbeat time.Duration, move bool, timeout time.Duration) (*liveClient, error) {
	c := &liveClient{
		tb: tb, user: user, urls: urls, move: move, heartbeat: heartbeat,
		seen: make(map[string][]sighting), inits: make(map[string]bool), stop: make(chan struct{}),
	}
	conn, err := dialRetry(urls[0], user, timeout)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	c.wg.Add(2)
	go c.readLoop()
	go c.heartbeatLoop()
	tb.Cleanup(c.abort)
	return c, nil
}

// dialRetry dials a gateway as user until it succeeds or timeout passes.
func dialRetry(url, user string, timeout time.Duration) (*client.Conn, error) {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), min(dialTimeout, max(time.Until(deadline), time.Second)))
		conn, err := client.Dial(ctx, url+"?user="+user, client.Options{})
		cancel()
		if err == nil {
			return conn, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("dial %s as %s: %w", url, user, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *liveClient) current() *client.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

func (c *liveClient) readLoop() {
	defer c.wg.Done()
	for {
		conn := c.current()
		m, _, err := conn.Read()
		now := time.Now()
		if err == nil {
			c.take(now, m)
			continue
		}
		code := 0
		var ce *client.CloseError
		if errors.As(err, &ce) {
			code = int(ce.Code)
		}
		c.mu.Lock()
		if c.ended {
			c.mu.Unlock()
			return
		}
		c.closes = append(c.closes, closeEvent{at: now, code: code, url: c.urls[c.at]})
		move := c.move && code == protocol.CloseGoingAway && len(c.urls) > 1
		c.mu.Unlock()
		_ = conn.Abort()
		if !move || !c.reconnect() {
			return
		}
	}
}

// reconnect moves to the next gateway after a 1001, with jitter, and
// subscribes again to what it watched.
func (c *liveClient) reconnect() bool {
	select {
	case <-c.stop:
		return false
	case <-time.After(time.Duration(rand.Int64N(int64(50 * time.Millisecond)))):
	}
	c.mu.Lock()
	next := (c.at + 1) % len(c.urls)
	c.mu.Unlock()
	conn, err := dialRetry(c.urls[next], c.user, dialTimeout)
	if err != nil {
		c.tb.Errorf("%s: reconnect after 1001: %v", c.user, err)
		return false
	}
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		_ = conn.Abort()
		return false
	}
	c.conn, c.at = conn, next
	c.moves = append(c.moves, time.Now())
	subs := slices.Clone(c.subs)
	c.nextID++
	id := fmt.Sprintf("s%d", c.nextID)
	c.mu.Unlock()
	if len(subs) > 0 {
		_ = conn.Subscribe(id, subs...)
	}
	return true
}

func (c *liveClient) heartbeatLoop() {
	defer c.wg.Done()
	tick(c.stop, c.heartbeat, func() bool {
		_ = c.current().Heartbeat()
		return true
	})
}

// take records one message.
func (c *liveClient) take(now time.Time, m protocol.ServerMessage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch m.Type {
	case protocol.TypePresenceInit:
		for _, p := range m.Users {
			c.seen[p.UserID] = append(c.seen[p.UserID], sighting{now, p})
		}
		c.inits[m.ID] = true
	case protocol.TypePresenceBatch:
		for _, p := range m.Updates {
			c.seen[p.UserID] = append(c.seen[p.UserID], sighting{now, p})
		}
	case protocol.TypeSelf:
		c.selfs = append(c.selfs, m)
	case protocol.TypeError, protocol.TypeDenied:
		c.errs = append(c.errs, m)
	}
}

// subscribe watches users and waits for the presence_init.
func (c *liveClient) subscribe(users ...string) {
	c.tb.Helper()
	c.mu.Lock()
	c.nextID++
	id := fmt.Sprintf("s%d", c.nextID)
	c.subs = append(c.subs, users...)
	conn := c.conn
	c.mu.Unlock()
	if err := conn.Subscribe(id, users...); err != nil {
		c.tb.Fatalf("%s: subscribe: %v", c.user, err)
	}
	waitFor(c.tb, 30*time.Second, c.user+" presence_init", func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.inits[id] {
			return nil
		}
		return fmt.Errorf("no presence_init; errors: %v", c.errs)
	})
}

// subscribeAll watches every user (global presence) and waits for the
// presence_init.
func (c *liveClient) subscribeAll() {
	c.tb.Helper()
	c.mu.Lock()
	c.nextID++
	id := fmt.Sprintf("s%d", c.nextID)
	conn := c.conn
	c.mu.Unlock()
	if err := conn.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: id, All: true}); err != nil {
		c.tb.Fatalf("%s: subscribe all: %v", c.user, err)
	}
	waitFor(c.tb, 30*time.Second, c.user+" presence_init of all", func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.inits[id] {
			return nil
		}
		return fmt.Errorf("no presence_init; errors: %v", c.errs)
	})
}

// setStatus chooses a status, different from the current one, and waits
// until a self frame confirms it. A gateway that cannot reach NATS answers
// with an unavailable error; the client then tries again, as an app would.
func (c *liveClient) setStatus(st presence.Status, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		conn := c.conn
		errs := len(c.errs)
		c.mu.Unlock()
		if err := conn.SetStatus(string(st)); err != nil {
			return fmt.Errorf("%s: send set_status: %w", c.user, err)
		}
		retry := time.Now().Add(5 * time.Second)
		for {
			c.mu.Lock()
			confirmed := len(c.selfs) > 0 && c.selfs[len(c.selfs)-1].Status == st
			failed := len(c.errs) > errs
			ended := c.ended || len(c.closes) > 0 && !c.move
			c.mu.Unlock()
			switch {
			case confirmed:
				return nil
			case ended:
				return fmt.Errorf("%s: socket closed while setting %s", c.user, st)
			case time.Now().After(deadline):
				return fmt.Errorf("%s: %s not confirmed within %v", c.user, st, timeout)
			}
			if failed || time.Now().After(retry) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// view returns the newest presence of user the socket was told.
func (c *liveClient) view(user string) (presence.Presence, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seen[user]
	if len(s) == 0 {
		return presence.Presence{}, false
	}
	return s[len(s)-1].p, true
}

// history returns every presence of user the socket was told.
func (c *liveClient) history(user string) []sighting {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.seen[user])
}

// closeEvents returns how the client's sockets ended.
func (c *liveClient) closeEvents() []closeEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.closes)
}

// end stops the client's goroutines after fn ended its socket.
func (c *liveClient) end(fn func(*client.Conn) error) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	c.ended = true
	conn := c.conn
	c.mu.Unlock()
	close(c.stop)
	_ = fn(conn)
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		c.tb.Errorf("%s: client goroutines did not end", c.user)
	}
}

// close closes the socket cleanly (close frame 1000).
func (c *liveClient) close() { c.end((*client.Conn).Close) }

// abort drops the TCP connection without a close frame.
func (c *liveClient) abort() { c.end((*client.Conn).Abort) }

// --- Checks ------------------------------------------------------------------

// truth is what watchers must end up seeing: each user's public status.
type truth map[string]presence.Status

// expectViews waits until every watcher was last told, of every user in
// want, the status want says.
func expectViews(tb testing.TB, timeout time.Duration, what string, watchers []*liveClient, want truth) {
	tb.Helper()
	waitFor(tb, timeout, what, func() error {
		var wrong []string
		for _, w := range watchers {
			for u, st := range want {
				p, ok := w.view(u)
				if !ok || p.Status != st {
					wrong = append(wrong, fmt.Sprintf("%s sees %s %q, want %q", w.user, u, p.Status, st))
				}
			}
		}
		if len(wrong) > 0 {
			sort.Strings(wrong)
			if len(wrong) > 8 {
				wrong = append(wrong[:8], fmt.Sprintf("and %d more", len(wrong)-8))
			}
			return errors.New(strings.Join(wrong, "; "))
		}
		return nil
	})
}

// neverOffline checks that no watcher was told that one of users was
// offline at a time in [from, to].
func neverOffline(tb testing.TB, watchers []*liveClient, users []string, from, to time.Time) {
	tb.Helper()
	for _, w := range watchers {
		for _, u := range users {
			for _, s := range w.history(u) {
				if s.p.Status == presence.Offline && !s.at.Before(from) && !s.at.After(to) {
					tb.Errorf("%s was told %s is offline at %s, while %s was connected",
						w.user, u, s.at.Format("15:04:05.000"), u)
				}
			}
		}
	}
}

// change is one status a user chose, and when the choice was sent.
type change struct {
	at time.Time
	st presence.Status
}

// inOrder checks that what a watcher was told of user since from follows
// the order of the user's changes: every presence is one the user chose
// (or offline, for invisible), chosen before it was read, and never older
// than one told before it. A stale or out-of-order event fails it.
func inOrder(tb testing.TB, w *liveClient, user string, from time.Time, changes []change) {
	tb.Helper()
	idx := 0
	for _, s := range w.history(user) {
		if s.at.Before(from) {
			continue
		}
		found := false
		for i := idx; i < len(changes) && !changes[i].at.After(s.at); i++ {
			if changes[i].st.Public() == s.p.Status {
				idx, found = i, true
				break
			}
		}
		if !found {
			tb.Errorf("%s was told %s is %s at %s: not a status %s had then, or older than one told before",
				w.user, user, s.p.Status, s.at.Format("15:04:05.000"), user)
			return
		}
	}
}

// repeats counts, over every watcher and user, the presences a watcher
// was told that are the same as the one it was told before: not wrong, but
// not a change either.
func repeats(watchers []*liveClient, users []string, from time.Time) int {
	n := 0
	for _, w := range watchers {
		for _, u := range users {
			var prev *presence.Presence
			for _, s := range w.history(u) {
				if !s.at.Before(from) && prev != nil && *prev == s.p {
					n++
				}
				p := s.p
				prev = &p
			}
		}
	}
	return n
}

// offlineWithin checks that every watcher was told user is offline within
// limit after since, and returns the longest delay seen.
func offlineWithin(tb testing.TB, watchers []*liveClient, user string, since time.Time, limit time.Duration) time.Duration {
	tb.Helper()
	var longest time.Duration
	for _, w := range watchers {
		var at time.Time
		for _, s := range w.history(user) {
			if s.p.Status == presence.Offline && s.at.After(since) {
				at = s.at
				break
			}
		}
		switch {
		case at.IsZero():
			tb.Errorf("%s was never told %s is offline", w.user, user)
		case at.Sub(since) > limit:
			tb.Errorf("%s was told %s is offline %v after it went, want within %v", w.user, user, at.Sub(since).Round(time.Millisecond), limit)
		}
		longest = max(longest, at.Sub(since))
	}
	return longest
}

// mutual makes every watcher and every user follow each other.
func mutual(tb testing.TB, store *presence.Store, watchers, users []string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, w := range watchers {
		for _, u := range users {
			if w == u {
				continue
			}
			for _, e := range [][2]string{{w, u}, {u, w}} {
				if err := store.Follow(ctx, e[0], e[1]); err != nil {
					tb.Fatalf("follow %s -> %s: %v", e[0], e[1], err)
				}
			}
		}
	}
}

// names returns prefix0 ... prefix<n-1>.
func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}
