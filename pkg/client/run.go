package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// dial makes one connection attempt.
func (c *Client) dial(ctx context.Context) (*Conn, error) {
	o := Options{Header: c.cfg.Header.Clone(), LocalAddr: c.cfg.LocalAddr, Timeout: c.cfg.DialTimeout, Compression: c.cfg.Compression}
	c.mu.Lock()
	token := c.token
	c.mu.Unlock()
	var life tokenLife
	if c.cfg.TokenFunc != nil {
		var err error
		if token, err = c.cfg.TokenFunc(ctx); err != nil {
			return nil, fmt.Errorf("get token: %w", err)
		}
		if token == "" {
			return nil, errors.New("get token: the token func returned an empty token")
		}
		life = lifeOf(token, time.Now())
	}
	if token != "" {
		if o.Header == nil {
			o.Header = make(http.Header)
		}
		o.Header.Set("Authorization", "Bearer "+token)
	}
	conn, err := Dial(ctx, c.url, o)
	if err != nil {
		return nil, err
	}
	conn.life = life
	return conn, nil
}

// open makes connection attempts until one succeeds, ctx ends or the
// gateway refuses for good. It waits wait before the first, and a backoff
// delay before each later one, counted by *attempt. notify, when set, is
// told of every failed attempt.
func (c *Client) open(ctx context.Context, wait time.Duration, attempt *int, notify func(Disconnected)) (*Conn, error) {
	var last error
	for failed := 0; ; {
		select {
		case <-ctx.Done():
			if last != nil {
				return nil, fmt.Errorf("%w; last attempt: %w", ctx.Err(), last)
			}
			return nil, ctx.Err()
		case <-time.After(wait):
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

// permanent reports whether err means the gateway refuses this client for
// good, so that trying again is pointless: an upgrade refused with a 4xx
// status other than 408 and 429, or a close code for a broken client or a
// policy violation. A token that expired while connected, or a renewal
// the gateway refused (1008 "unauthorized"), is not permanent when
// TokenFunc can give a new token.
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
			return c.cfg.TokenFunc == nil || ce.Reason != "token expired" && ce.Reason != "unauthorized"
		}
	}
	return false
}

// attach makes conn the open connection: it sends the chosen status, the
// idle state, the subscriptions and the rooms' joins again, and returns
// the hello.
func (c *Client) attach(conn *Conn) protocol.Hello {
	h := hello(conn.Hello)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hello = h
	c.conn = conn
	c.life = conn.life
	c.activitySent, c.activityDue = time.Time{}, false
	if c.status != "" {
		c.statusSent = true
		c.sendLocked(protocol.ClientMessage{Type: protocol.TypeSetStatus, Status: string(c.status)})
	}
	if c.customPending {
		if c.custom.Expired(time.Now()) {
			// Too late to set; clearing it instead might clear one set
			// on another device since.
			c.custom, c.customPending = nil, false
		} else {
			c.sendLocked(customMessage(c.custom))
		}
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
	c.rejoinLocked()
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
		c.retryAt, c.refusals = time.Time{}, 0
		if c.flushTimer != nil && c.flushTimer.Stop() {
			c.timers.Done()
		}
		c.flushTimer = nil
		c.roomsLostLocked()
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
// goroutine sends the heartbeats and, with TokenFunc, another renews the
// token, until the connection ends or the client is closed. It returns
// why the connection ended.
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
	conn.writeTimeout = c.cfg.WriteTimeout
	closed := make(chan struct{})
	stopClose := context.AfterFunc(c.ctx, func() {
		defer close(closed)
		// The deadline of the last write may have passed long ago.
		_ = nc.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
		_ = conn.Close()
	})
	defer func() {
		if !stopClose() {
			<-closed
		}
	}()
	beating := make(chan struct{})
	renewing, stopRenewing := context.WithCancel(c.ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.beat(conn, every, &last, beating) })
	if c.cfg.TokenFunc != nil {
		wg.Go(func() { c.renew(renewing, conn) })
	}
	defer func() {
		close(beating)
		stopRenewing()
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

// beat sends a heartbeat (or activity, with KeepActive or when Activity
// left one due) every interval until stop is closed, and a ping when no
// frame came for an interval, whose pong shows the gateway is still there.
// A failed write aborts conn, which ends serve.
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
		sent, err := c.sendDueActivity(conn)
		if !sent && err == nil {
			err = c.write(conn, msg)
		}
		if err != nil {
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
		if m, ok := c.answeredLocked(ev.ID, true); ok && m.All {
			c.onlineLocked(ev.Users)
		}
		c.notedLocked(ev.Users)
	case Changes:
		c.notedLocked(ev.Updates)
	case Self:
		c.self = ev.Self
		if c.customPending && ev.Custom.Equal(c.custom) {
			c.customPending = false
		}
		// Another device chose a status: adopt it, so that a reconnect
		// of this client does not undo that choice. An automatic away
		// is not a choice.
		// Until this client's own choice is confirmed (or turned away
		// because the user is idle), a Self frame shows an earlier one.
		switch st := ev.Status; {
		case c.status == "":
		case c.statusSent:
			c.statusSent = st != c.status && st != presence.Away
		case st != c.status && st != presence.Away:
			if _, err := presence.ParseChosen(string(st)); err == nil {
				c.status = st
			}
		}
	case ServerError:
		if ev.Code == protocol.CodeRateLimited {
			// Too many requests waited, or room updates came too
			// fast: the request is sent again. Without an id, the
			// message rate limit dropped a message.
			if ev.ID == "" {
				c.droppedLocked()
			} else {
				c.refusedLocked(ev.ID)
			}
			break
		}
		if m, ok := c.answeredLocked(ev.ID, false); ok && m.Type == protocol.TypeSubscribe && !transient(ev.Code) {
			// The subscribe was refused as a whole, for good: its users
			// are not watched.
			c.unwatchLocked(m)
		}
	case RoomState:
		c.roomStateLocked(ev.RoomState)
		c.answeredLocked(ev.ID, true)
	case RoomDiff:
		c.roomDiffLocked(ev.RoomDiff)
	case RoomDenied:
		// A join of the room sent after the refused one decides, as
		// the gateway handles it after the refusal.
		i := c.waitingLocked(ev.ID)
		if i < 0 || !c.laterLocked(i+1, func(m protocol.ClientMessage) bool {
			return m.Type == protocol.TypeJoin && m.Room == ev.Room
		}) {
			delete(c.rooms, ev.Room)
		}
		c.answeredLocked(ev.ID, false)
	case Denied:
		// A denied with an id answers a subscribe: only a subscribe to
		// all is answered with nothing else (the others with a
		// presence_init first, which ended them). So what still waits
		// was sent after it, and a subscribe of the same user there
		// decides.
		c.answeredLocked(ev.ID, true)
		later := ev.ID != "" && c.laterLocked(0, func(m protocol.ClientMessage) bool {
			return m.Type == protocol.TypeSubscribe && (m.All && ev.UserID == "*" || slices.Contains(m.UserIDs, ev.UserID))
		})
		switch {
		case later:
		case ev.UserID == "*":
			c.all = false
		default:
			delete(c.watched, ev.UserID)
			delete(c.presence, ev.UserID)
		}
	}
	c.mu.Unlock()
	c.emit(ev)
}

// laterLocked reports whether a request waiting from index from on, or
// in the backlog, matches.
func (c *Client) laterLocked(from int, match func(protocol.ClientMessage) bool) bool {
	for _, w := range c.waiting[from:] {
		if match(w.m) {
			return true
		}
	}
	return slices.ContainsFunc(c.backlog, match)
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

// onlineLocked takes the answer to a subscribe to all, which lists the
// users online now: the users watched only through it that it does not
// list went offline unseen (while the client reconnected) or are not
// known, and their presence is forgotten.
func (c *Client) onlineLocked(list []presence.Presence) {
	listed := make(map[string]bool, len(list))
	for _, p := range list {
		listed[p.UserID] = true
	}
	for id := range c.presence {
		if _, watched := c.watched[id]; !watched && !listed[id] {
			delete(c.presence, id)
		}
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
