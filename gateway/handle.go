package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// errConnClosed means the connection closed while a request was served.
var errConnClosed = errors.New("connection closed")

// requestTimeout bounds the NATS work one client message causes.
const requestTimeout = 10 * time.Second

var _ frameSink = (*conn)(nil)

// message handles one client message. It runs on the goroutine reading the
// socket, so one connection's messages are handled in order.
func (c *conn) message(payload []byte) bool {
	now := time.Now().UnixNano()
	c.lastFrame.Store(now)
	s := c.s
	if !c.allow(now) {
		return c.limited()
	}
	if protocol.IsHeartbeat(payload) {
		// The most frequent message needs no decoding, no context and
		// no NATS work: the frame itself was the sign of life.
		s.metrics.heartbeatMsgs.Inc()
		s.metrics.heartbeats.Inc()
		return c.open()
	}
	var m protocol.ClientMessage
	if err := protocol.DecodeClient(payload, &m); err != nil {
		s.metrics.msgsIn.WithLabelValues("invalid").Inc()
		c.sendError(m.ID, protocol.CodeBadRequest, err.Error())
		return c.open()
	}
	if protocol.KnownClientType(m.Type) {
		s.metrics.msgsIn.WithLabelValues(m.Type).Inc()
	} else {
		s.metrics.msgsIn.WithLabelValues("unknown").Inc()
	}
	ctx, cancel := context.WithTimeout(s.ctx, requestTimeout)
	defer cancel()
	switch m.Type {
	case protocol.TypeHeartbeat:
		s.metrics.heartbeats.Inc()
	case protocol.TypeActivity:
		c.active(ctx, now, m.ID)
	case protocol.TypeIdle:
		c.setIdle(ctx, m.ID)
	case protocol.TypeAuth:
		c.reauth(&m)
	case protocol.TypeSetStatus:
		c.setStatus(ctx, now, &m)
	case protocol.TypeSubscribe:
		c.subscribe(ctx, &m)
	case protocol.TypeUnsubscribe:
		c.unsubscribe(&m)
	default:
		c.sendError(m.ID, protocol.CodeUnknownType, fmt.Sprintf("unknown message type %q", m.Type))
	}
	return c.open()
}

// control handles a ping, pong or close frame.
func (c *conn) control(op ws.OpCode, payload []byte) bool {
	now := time.Now().UnixNano()
	c.lastFrame.Store(now)
	switch op {
	case ws.OpPing:
		c.s.metrics.heartbeats.Inc()
		if !c.allow(now) {
			return c.limited()
		}
		c.writeControl(ws.OpPong, payload)
	case ws.OpClose:
		code, reason := ws.ParseCloseFrameData(payload)
		switch {
		case len(payload) == 0:
			code = ws.StatusNormalClosure
		case len(payload) == 1 || code > maxCloseCode || ws.CheckCloseFrameData(code, reason) != nil:
			// gobwas/ws takes codes of 5000 and more; RFC 6455 defines
			// none, so echoing one back would break the protocol too.
			c.end(endClean, ws.StatusProtocolError, "invalid close frame")
			return false
		}
		c.end(endClean, code, "")
		return false
	}
	return c.open()
}

// maxCloseCode is the highest close code RFC 6455 lets a peer send (the
// top of the private range 4000-4999).
const maxCloseCode = 4999

func (c *conn) open() bool { return !c.closed.Load() }

// allow takes a token from the connection's rate limiter.
func (c *conn) allow(now int64) bool {
	cfg := &c.s.cfg
	if c.tokenAt == 0 {
		c.tokens, c.tokenAt = float32(cfg.RateBurst), now
	}
	c.tokens = min(float32(cfg.RateBurst), c.tokens+float32(float64(now-c.tokenAt)/1e9*cfg.RateLimit))
	c.tokenAt = now
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

// limited answers a message over the rate limit: a rate_limited error, or,
// after RateStrikes of them within a minute, a close with 1008.
func (c *conn) limited() bool {
	now := time.Now().UnixNano()
	if now-c.strikeW > int64(time.Minute) {
		c.strikeW, c.strikes = now, 0
	}
	c.strikes++
	c.s.metrics.msgsIn.WithLabelValues("rate_limited").Inc()
	if int(c.strikes) > c.s.cfg.RateStrikes {
		c.end(endClean, ws.StatusPolicyViolation, "rate limit exceeded")
		return false
	}
	c.sendError("", protocol.CodeRateLimited, fmt.Sprintf("too many messages: at most %g per second", c.s.cfg.RateLimit))
	return c.open()
}

// sendError writes an error frame.
func (c *conn) sendError(id, code, message string) {
	c.sendJSON(protocol.TypeError, &protocol.Error{Type: protocol.TypeError, ID: id, Code: code, Message: message})
}

// sendDenied writes a denied frame.
func (c *conn) sendDenied(id, userID, reason string) {
	c.sendJSON(protocol.TypeDenied, &protocol.Denied{Type: protocol.TypeDenied, ID: id, UserID: userID, Reason: reason})
}

func (c *conn) sendJSON(typ string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		c.s.log.Error("encode frame", "type", typ, "err", err)
		return
	}
	if c.writeText(data) == nil {
		c.s.metrics.msgsOut.WithLabelValues(typ).Inc()
	}
}

// sendJSONLocked is sendJSON for a caller holding wmu.
func (c *conn) sendJSONLocked(typ string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := c.writeTextLocked(data); err != nil {
		return err
	}
	c.s.metrics.msgsOut.WithLabelValues(typ).Inc()
	return nil
}

// unavailable answers a message whose NATS work failed.
func (c *conn) unavailable(id string, err error) {
	if errors.Is(err, errConnClosed) || !c.open() {
		return
	}
	c.s.log.Warn("request failed", "user_id", c.userID, "conn_id", c.connID, "err", err)
	c.sendError(id, protocol.CodeUnavailable, "presence state is unavailable right now; try again")
}

// reauth takes a fresh token for the connection.
func (c *conn) reauth(m *protocol.ClientMessage) {
	s := c.s
	fail := func(msg string) {
		c.sendError(m.ID, protocol.CodeUnauthorized, msg)
		c.end(endClean, ws.StatusPolicyViolation, "unauthorized")
	}
	if m.Token == "" {
		fail("auth needs a token")
		return
	}
	if s.cfg.Tokens == nil {
		fail("this gateway accepts no tokens")
		return
	}
	userID, exp, err := s.cfg.Tokens.Verify(m.Token)
	if err != nil {
		fail("invalid token: " + err.Error())
		return
	}
	if userID != c.userID {
		fail("the token is for another user")
		return
	}
	c.expires.Store(exp.UnixNano())
}

// setStatus writes the user's chosen status. Choosing is a sign of use, so
// it also counts as activity on this connection.
func (c *conn) setStatus(ctx context.Context, now int64, m *protocol.ClientMessage) {
	st, err := presence.ParseChosen(m.Status)
	if err != nil {
		c.sendError(m.ID, protocol.CodeInvalidStatus, err.Error())
		return
	}
	c.active(ctx, now, m.ID)
	_, _, _, err = c.s.store.UpdateStatus(ctx, c.userID, func(r *presence.Record) error {
		if r.ChosenStatus() == st {
			return presence.ErrNoChange
		}
		r.Chosen = st
		return nil
	})
	c.s.metrics.kvWrites.WithLabelValues("status").Inc()
	if err != nil {
		c.s.metrics.kvErrors.WithLabelValues("status").Inc()
		c.unavailable(m.ID, err)
	}
}

// subscribe answers a subscribe message: presence_init with the current
// state of every allowed target, and a denied frame per refused one.
func (c *conn) subscribe(ctx context.Context, m *protocol.ClientMessage) {
	s := c.s
	if m.All {
		c.subscribeAll(m.ID)
		return
	}
	if len(m.UserIDs) == 0 {
		c.sendError(m.ID, protocol.CodeBadRequest, `subscribe needs "user_ids" (an array of user ids) or "all": true`)
		return
	}
	if len(m.UserIDs) > s.cfg.MaxSubscribeIDs {
		c.sendError(m.ID, protocol.CodeBadRequest, fmt.Sprintf("at most %d user ids per subscribe", s.cfg.MaxSubscribeIDs))
		return
	}
	type denial struct{ userID, reason string }
	var denied []denial
	var allowed []string
	var lastSeen []bool
	seen := make(map[string]bool, len(m.UserIDs))
	room := s.cfg.MaxSubscriptions - s.hub.subCount(c)
	for _, u := range m.UserIDs {
		if seen[u] {
			continue
		}
		seen[u] = true
		if !presence.ValidUserID(u) {
			denied = append(denied, denial{u, protocol.ReasonInvalidUserID})
			continue
		}
		already := s.hub.watching(c, u)
		if !already && room <= 0 {
			denied = append(denied, denial{u, protocol.ReasonTooManySubscriptions})
			continue
		}
		d, err := s.authz.decide(ctx, c.userID, u)
		if err != nil {
			c.unavailable(m.ID, err)
			return
		}
		if !d.allowed {
			denied = append(denied, denial{u, d.reason})
			continue
		}
		if !already {
			room--
		}
		allowed = append(allowed, u)
		lastSeen = append(lastSeen, d.lastSeen)
	}

	// Hold the socket until presence_init is written, so no batch
	// overtakes it.
	c.wmu.Lock()
	defer c.wmu.Unlock()
	users, err := s.snapshot(ctx, c, allowed, lastSeen)
	if err != nil {
		s.hub.unsubscribe(c, allowed)
		c.wmu.Unlock()
		c.unavailable(m.ID, err)
		c.wmu.Lock()
		return
	}
	if err := c.sendJSONLocked(protocol.TypePresenceInit, &protocol.PresenceInit{
		Type: protocol.TypePresenceInit, ID: m.ID, Users: users,
	}); err != nil {
		return
	}
	for _, d := range denied {
		if c.sendJSONLocked(protocol.TypeDenied, &protocol.Denied{
			Type: protocol.TypeDenied, ID: m.ID, UserID: d.userID, Reason: d.reason,
		}) != nil {
			return
		}
	}
}

// snapshotEntry is one user's presence as of a status revision.
type snapshotEntry struct {
	p   presence.Presence
	rev uint64
}

// snapshot subscribes c to users and returns their current presence, as c
// may see it. Events newer than the snapshot are delivered afterwards;
// older ones are dropped.
func (s *Service) snapshot(ctx context.Context, c *conn, users []string, lastSeen []bool) ([]presence.Presence, error) {
	if len(users) == 0 {
		return []presence.Presence{}, nil
	}
	subscribed, err := s.hub.begin(c, users, lastSeen)
	if err != nil {
		return nil, err
	}
	if subscribed {
		// The server must know of the new subscriptions before the
		// snapshot is read, or an event published in between is lost.
		if err := s.nc.FlushWithContext(ctx); err != nil {
			return nil, fmt.Errorf("flush subscriptions: %w", err)
		}
	}
	entries := make([]snapshotEntry, len(users))
	for i, u := range users {
		p, rev, err := s.presenceOf(ctx, u)
		if err != nil {
			return nil, err
		}
		entries[i] = snapshotEntry{p, rev}
	}
	s.hub.finish(c, entries)
	out := make([]presence.Presence, len(entries))
	for i := range entries {
		out[i] = entries[i].p
	}
	return out, nil
}

// presenceOf reads what others see of a user, with last_seen, and the
// revision of the status record it comes from.
func (s *Service) presenceOf(ctx context.Context, userID string) (presence.Presence, uint64, error) {
	start := time.Now()
	rec, rev, err := s.store.Status(ctx, userID)
	s.metrics.kvLatency.WithLabelValues("get_status").Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, presence.ErrNotFound):
		return presence.Presence{UserID: userID, Status: presence.Offline}, rev, nil
	case err != nil:
		return presence.Presence{}, 0, err
	}
	return rec.Presence(userID), rev, nil
}

// subscribeAll answers a subscribe with "all": true.
func (c *conn) subscribeAll(id string) {
	s := c.s
	if s.cfg.Policy != PolicyEveryone {
		c.sendDenied(id, "*", protocol.ReasonNotAllowed)
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	users, count, err := s.online.subscribe(c, s.cfg.OnlineLimit)
	if err != nil {
		c.wmu.Unlock()
		c.unavailable(id, err)
		c.wmu.Lock()
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, requestTimeout)
	defer cancel()
	for i := range users {
		if !s.showLastSeen(ctx, c.userID, users[i].UserID) {
			users[i].LastSeen = 0
		}
	}
	_ = c.sendJSONLocked(protocol.TypePresenceInit, &protocol.PresenceInit{
		Type: protocol.TypePresenceInit, ID: id, Users: users, OnlineCount: &count,
	})
}

// unsubscribe ends subscriptions; it has no answer.
func (c *conn) unsubscribe(m *protocol.ClientMessage) {
	if m.All {
		c.s.online.unsubscribe(c)
	}
	c.s.hub.unsubscribe(c, m.UserIDs)
}

// resend delivers target's presence to c again, as c may now see it.
func (c *conn) resend(ctx context.Context, target string) {
	p, rev, err := c.s.presenceOf(ctx, target)
	if err != nil {
		c.s.log.Warn("resend presence", "user_id", c.userID, "target", target, "err", err)
		return
	}
	c.s.hub.resend(ctx, c, p, rev)
}

// unwatch ends every subscription of c that is not kept by the hub.
func (s *Service) unwatch(c *conn) {
	s.online.unsubscribe(c)
}
