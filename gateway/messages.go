package gateway

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/pkg/protocol"
)

// requestTimeout bounds the NATS work one client message causes.
const requestTimeout = 10 * time.Second

// message handles one client message. It runs on the goroutine reading the
// socket and never waits on NATS: what needs NATS (set_status, subscribe)
// is queued for the connection's requests goroutine, which handles them in
// order (an unsubscribe behind them waits its turn too).
//
// Every frame a client sends counts against one budget, its limiter: a
// message (for one in fragments, its last frame), each other fragment,
// each ping and pong. A frame over it is answered with rate_limited (a
// message one of whose frames was refused is dropped), and too many of
// those with close 1008.
func (s *Service) message(c *conn, payload []byte) bool {
	now := nowNano()
	c.lastFrame.Store(now)
	refused := c.msg&msgRefused != 0
	c.msg = 0
	if !c.limiter.Allow(now, s.cfg.RateLimit, s.cfg.RateBurst) {
		return s.limited(c, now)
	}
	if refused {
		return c.open() // answered with its fragment's rate_limited
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
		s.sendError(c, m.ID, protocol.CodeBadRequest, err.Error())
		return c.open()
	}
	if protocol.KnownClientType(m.Type) {
		s.metrics.msgsIn.WithLabelValues(m.Type).Inc()
	} else {
		s.metrics.msgsIn.WithLabelValues("unknown").Inc()
	}
	switch m.Type {
	case protocol.TypeHeartbeat:
		s.metrics.heartbeats.Inc()
	case protocol.TypeActivity:
		s.active(c, now)
	case protocol.TypeIdle:
		s.keys.setIdle(c, true)
	case protocol.TypeBackground:
		s.background(c, &m)
	case protocol.TypeAuth:
		s.reauth(c, &m)
	case protocol.TypeSetStatus:
		// Choosing is a sign of use.
		s.active(c, now)
		s.setStatus(c, &m)
	case protocol.TypeSetCustom:
		s.active(c, now)
		s.setCustom(c, &m)
	case protocol.TypeSubscribe:
		s.queueSubscribe(c, &m)
	case protocol.TypeJoin:
		s.members.joinMessage(c, &m)
	case protocol.TypeRoomUpdate:
		s.members.updateMessage(c, &m, now)
	case protocol.TypeLeave:
		s.members.leaveMessage(c, &m)
	case protocol.TypeTyping, protocol.TypeSignal:
		s.members.signalMessage(c, &m, now)
	case protocol.TypeUnsubscribe:
		if c.queued() {
			s.queueSubscribe(c, &m)
		} else {
			s.unsubscribe(c, &m)
		}
	default:
		s.sendError(c, m.ID, protocol.CodeUnknownType, fmt.Sprintf("unknown message type %q", m.Type))
	}
	return c.open()
}

// fragment handles a frame of a message in fragments but its last. It
// counts against the budget as any frame does, and is no sign of life: a
// message is once it is whole, so that a client that never ends one is
// ended at the TTL, whatever it sends between its fragments.
func (s *Service) fragment(c *conn) bool {
	c.msg |= msgOpen
	now := nowNano()
	if !c.limiter.Allow(now, s.cfg.RateLimit, s.cfg.RateBurst) {
		c.msg |= msgRefused
		return s.limited(c, now)
	}
	return c.open()
}

// control handles a ping, pong or close frame. A ping or pong counts
// against the budget as any frame does; one between the fragments of a
// message is no sign of life (see fragment).
func (s *Service) control(c *conn, op ws.OpCode, payload []byte) bool {
	now := nowNano()
	if c.msg&msgOpen == 0 {
		c.lastFrame.Store(now)
	}
	switch op {
	case ws.OpPing:
		s.metrics.heartbeats.Inc()
		if !c.limiter.Allow(now, s.cfg.RateLimit, s.cfg.RateBurst) {
			return s.limited(c, now)
		}
		c.sock.Lock()
		c.wrote(c.sock.WriteControlLocked(ws.OpPong, payload))
		c.sock.Unlock()
	case ws.OpPong:
		if !c.limiter.Allow(now, s.cfg.RateLimit, s.cfg.RateBurst) {
			return s.limited(c, now)
		}
	case ws.OpClose:
		code, reason := ws.ParseCloseFrameData(payload)
		switch {
		case len(payload) == 0:
			code = ws.StatusNormalClosure
		case len(payload) == 1 || code > maxCloseCode || ws.CheckCloseFrameData(code, reason) != nil:
			// gobwas/ws takes codes of 5000 and more; RFC 6455 defines
			// none, so echoing one back would break the protocol too.
			s.end(c, endClean, ws.StatusProtocolError, "invalid close frame")
			return false
		}
		s.end(c, endClean, code, "")
		return false
	}
	return c.open()
}

// maxCloseCode is the highest close code RFC 6455 lets a peer send (the
// top of the private range 4000-4999).
const maxCloseCode = 4999

// limited answers a frame over the rate limit: a rate_limited error, or,
// after RateStrikes of them within a minute, a close with 1008.
func (s *Service) limited(c *conn, now int64) bool {
	s.metrics.msgsIn.WithLabelValues("rate_limited").Inc()
	if c.limiter.Strike(now, s.cfg.RateStrikes) {
		s.end(c, endClean, ws.StatusPolicyViolation, "rate limit exceeded")
		return false
	}
	s.sendError(c, "", protocol.CodeRateLimited, fmt.Sprintf("too many frames (messages, fragments, pings, pongs): at most %g per second", s.cfg.RateLimit))
	return c.open()
}

// reauth takes a fresh token for the connection. One whose verification
// may wait for the keys to be read again is verified among the
// connection's requests, in order with those sent after it (a join the
// new token allows), so that no read worker waits on a key provider.
func (s *Service) reauth(c *conn, m *protocol.ClientMessage) {
	id, token := m.ID, m.Token
	if kr, ok := s.cfg.Tokens.(KeyRefresher); ok && kr.WaitsForKeys(token) {
		c.renewing(1)
		renew := func() {
			defer c.renewing(-1)
			s.renew(c, id, token)
		}
		if !s.enqueue(c, func(context.Context) { renew() }) {
			s.workers.Go(renew)
		}
		return
	}
	s.renew(c, id, token)
}

// renew verifies a fresh token for the connection, and takes it: its
// expiry, its rooms claim, and under the token policy its watch claim.
func (s *Service) renew(c *conn, id, token string) {
	fail := func(msg string) {
		s.sendError(c, id, protocol.CodeUnauthorized, msg)
		s.end(c, endClean, ws.StatusPolicyViolation, "unauthorized")
	}
	if token == "" {
		fail("auth needs a token")
		return
	}
	if s.cfg.Tokens == nil {
		fail("this gateway accepts no tokens")
		return
	}
	userID, exp, watch, err := s.verify(token)
	var rooms *roomGrant
	if err == nil {
		rooms, err = s.verifyRooms(token)
	}
	if err != nil {
		fail("invalid token: " + strings.TrimPrefix(err.Error(), ErrUnauthorized.Error()+": "))
		return
	}
	if userID != c.userID {
		fail("the token is for another user")
		return
	}
	c.expires.Store(exp.UnixNano())
	// A token may expire sooner than the one it replaces.
	s.due.at(c, exp.UnixNano())
	// The new rooms claim replaces the old one: the rooms it no longer
	// allows are left, with room_denied frames, in order with the
	// connection's other room requests.
	c.roomGrant.Store(rooms)
	if !s.enqueue(c, func(context.Context) { s.members.revoke(c) }) {
		s.workers.Go(func() { s.members.revoke(c) })
	}
	if s.cfg.Policy == PolicyToken {
		// The new watch claim replaces the old one: the subscriptions it
		// no longer allows end, with denied frames.
		c.watch.Store(watch)
		s.workers.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			defer cancel()
			s.authz.Recheck(ctx, c)
		})
	}
}

// active notes a sign of use at now (unix ns): an idle connection is
// active again.
func (s *Service) active(c *conn, now int64) {
	c.lastActivity.Store(now)
	s.keys.setIdle(c, false)
}

// background marks c's app gone to the background, for the grace the
// message asks (at most the gateway's BackgroundGrace, which one that
// asks none gets); it has no answer, except an error for a grace that is
// not a positive number of milliseconds.
func (s *Service) background(c *conn, m *protocol.ClientMessage) {
	grace := s.cfg.BackgroundGrace
	if m.GraceMS != nil {
		if *m.GraceMS <= 0 {
			s.sendError(c, m.ID, protocol.CodeBadRequest, "grace_ms must be a positive number of milliseconds")
			return
		}
		if *m.GraceMS < grace.Milliseconds() {
			grace = time.Duration(*m.GraceMS) * time.Millisecond
		}
	}
	s.keys.setBackground(c, grace)
}

// unsubscribe ends subscriptions; it has no answer. A change of a user
// no longer watched that waits in c's box is dropped, so that none is
// written after the unsubscribe; unless c watches everyone, which still
// shows it.
func (s *Service) unsubscribe(c *conn, m *protocol.ClientMessage) {
	if m.All && s.online != nil {
		s.online.unsubscribe(c)
	}
	s.hub.Remove(c, m.UserIDs)
	if s.online != nil && s.online.watching(c) {
		return
	}
	for _, u := range m.UserIDs {
		c.box.Remove(u)
	}
}
