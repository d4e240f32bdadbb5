package client

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// Limits of one subscribe or unsubscribe message (docs/protocol.md).
const (
	MaxSubscribeIDs = 100
	MaxMessageBytes = 4096
)

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

// The gateway handles a socket's requests (subscribe, unsubscribe, join,
// room_update, leave) in order, through a queue that takes 16 waiting
// ones, set_status messages included; one more is refused with an error
// rate_limited echoing its id, and changes nothing. So the client keeps
// at most requestWindow of its own requests waiting there, and sends the
// rest of its backlog as they are handled (inFlightLocked):
//
//   - subscribe and join are answered once handled (presence_init, or
//     denied "*" for a subscribe to all; room_state), and as the gateway
//     handles them in order, such an answer also says that every request
//     sent before it was handled. They count until then.
//   - unsubscribe, room_update and leave have no answer. They need no
//     NATS, so the gateway handles them at once unless an answered
//     request of the client is still ahead of them: while one is, they
//     count, and its answer (or a later one) says they were handled.
//     With none ahead they count only for settle after they were sent,
//     which paces a burst of them. Counting them until a later answer
//     instead could hold the window forever, as nothing may be answered
//     after them.
//
// So what counts past settle waits behind an answered request, whose
// answer comes (or the connection ends, or, if the message rate limit
// dropped it, droppedLocked sends it again): the window frees itself.
//
// An error or room_denied echoing a request's id may come before the
// requests ahead of it were handled (the gateway refuses some messages as
// it reads them), so it ends only that request. A request refused with
// rate_limited (the queue was full of set_status messages, or room_update
// was over its own rate) is sent again after a backoff (refusedLocked),
// and so is every request waiting when the message rate limit dropped a
// message, which may have been one of them (droppedLocked).

// requestWindow is how many requests may wait at the gateway at once:
// half of what it takes, leaving room for the set_status messages that
// wait in the same queue.
const requestWindow = 8

// settle is how long a request without an answer, sent with no answered
// request ahead of it, counts as waiting at the gateway.
const settle = 100 * time.Millisecond

// forgetAfter is how long a request without an answer is remembered once
// it counts no more, so that a refusal of it is still recognised: the
// gateway refuses a request as it reads it, so the refusal comes within
// a round trip.
const forgetAfter = time.Minute

// A refused request is sent again after retryBase, doubled with every
// refusal until an answer shows that the gateway's queue moves, up to
// retryMax.
const (
	retryBase = 100 * time.Millisecond
	retryMax  = 5 * time.Second
)

// Requests are sent at most requestRate a second after a burst of
// requestBurst: half of the gateway's default message rate limit, leaving
// the rest to heartbeats and status changes.
const (
	requestRate  = 10
	requestBurst = 20
)

// sentRequest is a request sent on the open connection whose handling
// the client has not seen yet.
type sentRequest struct {
	m  protocol.ClientMessage
	at time.Time
}

// hasAnswer reports whether the gateway answers a request of m's type once
// it has handled it.
func hasAnswer(m protocol.ClientMessage) bool {
	return m.Type == protocol.TypeSubscribe || m.Type == protocol.TypeJoin
}

// requestLocked queues a request for the open connection, after those
// before it, and sends what may go now.
func (c *Client) requestLocked(m protocol.ClientMessage) {
	if c.conn == nil {
		return
	}
	c.backlog = append(c.backlog, m)
	c.flushLocked()
}

// inFlightLocked counts the requests that may still wait at the gateway
// (see requestWindow), and returns when the first of those counted for
// settle stops counting (zero if none).
func (c *Client) inFlightLocked(now time.Time) (n int, settles time.Time) {
	behind := false
	for _, w := range c.waiting {
		behind = behind || hasAnswer(w.m)
		switch {
		case behind:
			n++
		case now.Sub(w.at) < settle:
			n++
			if settles.IsZero() {
				settles = w.at.Add(settle)
			}
		}
	}
	return n, settles
}

// flushLocked sends the backlog's messages in order while the requests
// waiting at the gateway, the rate and a refusal's backoff leave room.
// When time will make room, a timer goes on later; an answer goes on too
// (answeredLocked).
func (c *Client) flushLocked() {
	now := time.Now()
	c.tokens = min(requestBurst, c.tokens+now.Sub(c.refilled).Seconds()*requestRate)
	c.refilled = now
	// Requests with no answered one ahead, sent long ago, are forgotten:
	// a refusal of them would have come.
	for len(c.waiting) > 0 && !hasAnswer(c.waiting[0].m) && now.Sub(c.waiting[0].at) >= forgetAfter {
		c.waiting = c.waiting[1:]
	}
	for len(c.backlog) > 0 && c.conn != nil {
		if now.Before(c.retryAt) {
			c.wakeLocked(c.retryAt.Sub(now))
			return
		}
		if n, settles := c.inFlightLocked(now); n >= requestWindow {
			if !settles.IsZero() {
				c.wakeLocked(settles.Sub(now))
			}
			return
		}
		if c.tokens < 1 {
			c.wakeLocked(time.Duration((1 - c.tokens) / requestRate * float64(time.Second)))
			return
		}
		next := c.backlog[0]
		c.tokens--
		c.backlog = c.backlog[1:]
		c.sendLocked(next)
		c.waiting = append(c.waiting, sentRequest{m: next, at: now})
	}
}

// wakeLocked has the backlog flushed again after d, unless a flush is
// already due: that one looks again at what holds the backlog.
func (c *Client) wakeLocked(d time.Duration) {
	if c.flushTimer == nil {
		c.timers.Add(1)
		var t *time.Timer
		t = time.AfterFunc(d, func() { c.flushLater(&t) })
		c.flushTimer = t
	}
}

// flushLater is the flush of the timer *t. A timer that fired as its
// connection ended may run after the next one set a timer of its own:
// it leaves that one in place, for the connection's end to stop.
func (c *Client) flushLater(t **time.Timer) {
	defer c.timers.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flushTimer == *t {
		c.flushTimer = nil
	}
	c.flushLocked()
}

// waitingLocked returns the index in waiting of the request with this
// id; -1 for none.
func (c *Client) waitingLocked(id string) int {
	if id == "" {
		return -1
	}
	return slices.IndexFunc(c.waiting, func(w sentRequest) bool { return w.m.ID == id })
}

// answeredLocked takes the gateway's answer to the request with this id,
// and lets the backlog go on. An answer sent where the gateway handles
// the request in order (inOrder: presence_init, denied, room_state) says
// that the requests sent before it were handled too; one sent as the
// gateway read the request (an error, room_denied) says nothing of them.
// It returns the request, and false when id is none waiting.
func (c *Client) answeredLocked(id string, inOrder bool) (protocol.ClientMessage, bool) {
	i := c.waitingLocked(id)
	if i < 0 {
		return protocol.ClientMessage{}, false
	}
	m := c.waiting[i].m
	if inOrder {
		c.waiting = slices.Delete(c.waiting, 0, i+1)
		c.refusals = 0
	} else {
		c.waiting = slices.Delete(c.waiting, i, i+1)
	}
	c.flushLocked()
	return m, true
}

// refusedLocked takes the refusal (error rate_limited) of the request
// with this id: nothing of it happened at the gateway, so what it was for
// is sent again after a backoff. It reports false when id is none
// waiting.
func (c *Client) refusedLocked(id string) bool {
	i := c.waitingLocked(id)
	if i < 0 {
		return false
	}
	// The retry takes its place ahead of the backlog: nothing there says
	// anything about its room or users (againLocked).
	again := c.againAtLocked(i)
	c.waiting = slices.Delete(c.waiting, i, i+1)
	c.backlog = append(again, c.backlog...)
	c.holdLocked()
	c.flushLocked()
	return true
}

// droppedLocked takes an error rate_limited without an id: the gateway's
// message rate limit dropped a message as it read it, and which one
// cannot be told (Typing and Signal carry an id so that the refusals of
// the signal rate can). Any request waiting may be it, and an answered
// one would then never be answered, holding the window for good: each is
// sent again, as the client wants it now, after a backoff, and the ones
// sent before count no more. Sending one twice is harmless; the gateway
// answers a subscribe or join again.
func (c *Client) droppedLocked() {
	var again []protocol.ClientMessage
	for i := range c.waiting {
		again = append(again, c.againAtLocked(i)...)
	}
	c.waiting = nil
	c.backlog = append(again, c.backlog...)
	c.holdLocked()
	c.flushLocked()
}

// holdLocked holds the backlog for the backoff of one more refusal; a
// refusal long after the last backoff ended starts anew.
func (c *Client) holdLocked() {
	now := time.Now()
	if now.Sub(c.retryAt) > retryMax {
		c.refusals = 0
	}
	c.refusals++
	c.retryAt = now.Add(min(retryMax, retryBase<<min(c.refusals-1, 16)))
}

// againAtLocked returns what sends the waiting request at index i again
// (againLocked), given the requests that go to the gateway after it:
// those waiting after it, and the backlog.
func (c *Client) againAtLocked(i int) []protocol.ClientMessage {
	later := make([]protocol.ClientMessage, 0, len(c.waiting)-i-1+len(c.backlog))
	for _, w := range c.waiting[i+1:] {
		later = append(later, w.m)
	}
	later = append(later, c.backlog...)
	return c.againLocked(c.waiting[i].m, later)
}

// againLocked returns what sends again the refused request m, as the
// client wants it now, given the requests that go to the gateway after
// it (later); nothing when a later request already says something about
// the same room or user (that one decides, and is sent again itself if
// refused) or the client no longer wants it (a room left since, a user
// unwatched). So a leave refused and then a join of the same room end
// joined, and a join refused and then a leave end left, as the calls
// asked, whichever way the refusal and the later call cross.
func (c *Client) againLocked(m protocol.ClientMessage, later []protocol.ClientMessage) []protocol.ClientMessage {
	switch m.Type {
	case protocol.TypeJoin, protocol.TypeRoomUpdate, protocol.TypeLeave:
		// A later join or leave decides the membership; a later
		// room_update carries a newer meta, but joins nobody.
		if slices.ContainsFunc(later, func(l protocol.ClientMessage) bool {
			return l.Room == m.Room && (l.Type == protocol.TypeJoin || l.Type == protocol.TypeLeave || l.Type == m.Type)
		}) {
			return nil
		}
		r, in := c.rooms[m.Room]
		switch {
		case m.Type == protocol.TypeLeave && !in:
			return []protocol.ClientMessage{{Type: protocol.TypeLeave, ID: c.nextRoomIDLocked(), Room: m.Room}}
		case m.Type != protocol.TypeLeave && in:
			return []protocol.ClientMessage{{Type: m.Type, ID: c.nextRoomIDLocked(), Room: m.Room, Meta: r.meta}}
		}
		return nil
	case protocol.TypeSubscribe, protocol.TypeUnsubscribe:
		sub := m.Type == protocol.TypeSubscribe
		isSub := func(l protocol.ClientMessage) bool {
			return l.Type == protocol.TypeSubscribe || l.Type == protocol.TypeUnsubscribe
		}
		if m.All {
			if c.all != sub || slices.ContainsFunc(later, func(l protocol.ClientMessage) bool { return isSub(l) && l.All }) {
				return nil
			}
			return []protocol.ClientMessage{{Type: m.Type, ID: c.nextIDLocked(), All: true}}
		}
		named := make(map[string]bool)
		for _, l := range later {
			if isSub(l) {
				for _, id := range l.UserIDs {
					named[id] = true
				}
			}
		}
		var ids []string
		for _, id := range m.UserIDs {
			if _, watched := c.watched[id]; watched == sub && !named[id] {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			return nil
		}
		return []protocol.ClientMessage{{Type: m.Type, ID: c.nextIDLocked(), UserIDs: ids}}
	}
	return nil
}

func (c *Client) nextIDLocked() string {
	c.seq++
	return "s-" + strconv.FormatUint(c.seq, 10)
}
