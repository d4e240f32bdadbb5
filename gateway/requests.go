package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// maxQueued bounds the requests of one connection that wait for NATS
// (subscribe, and the answers to set_status): beyond it a subscribe is
// refused with rate_limited.
const maxQueued = 16

// requests are one connection's messages that need NATS, handled in order
// by a goroutine of their own, so that reading the socket (and so its
// heartbeats) never waits on NATS. The goroutine runs only while requests
// wait; Serve waits for it (workers).
type requests struct {
	mu      sync.Mutex
	queue   []func(context.Context)
	running bool
	// renewals counts the auth renewals among them not yet taken
	// (Service.reauth): while there are some, a join is checked against
	// the grant when its turn comes, not when it is read.
	renewals int32
}

// renewing adds n to c's renewals waiting among its requests.
func (c *conn) renewing(n int32) {
	c.reqs.mu.Lock()
	c.reqs.renewals += n
	c.reqs.mu.Unlock()
}

// renewalWaits reports whether an auth renewal of c waits among its
// requests.
func (c *conn) renewalWaits() bool {
	c.reqs.mu.Lock()
	defer c.reqs.mu.Unlock()
	return c.reqs.renewals > 0
}

// enqueue queues fn for c, and reports false when c has maxQueued waiting.
func (s *Service) enqueue(c *conn, fn func(context.Context)) bool {
	c.reqs.mu.Lock()
	defer c.reqs.mu.Unlock()
	if len(c.reqs.queue) >= maxQueued {
		return false
	}
	c.reqs.queue = append(c.reqs.queue, fn)
	if !c.reqs.running {
		c.reqs.running = true
		s.workers.Go(func() { s.serveRequests(c) })
	}
	return true
}

// queued reports whether c has requests waiting: a message that must stay
// in order with them (unsubscribe) joins them.
func (c *conn) queued() bool {
	c.reqs.mu.Lock()
	defer c.reqs.mu.Unlock()
	return c.reqs.running
}

// serveRequests handles c's queued requests until none is left.
func (s *Service) serveRequests(c *conn) {
	for {
		c.reqs.mu.Lock()
		if len(c.reqs.queue) == 0 || !c.open() {
			c.reqs.queue, c.reqs.running = nil, false
			c.reqs.mu.Unlock()
			return
		}
		fn := c.reqs.queue[0]
		c.reqs.queue[0] = nil
		c.reqs.queue = c.reqs.queue[1:]
		c.reqs.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		fn(ctx)
		cancel()
	}
}

// queueSubscribe queues a subscribe, or an unsubscribe that must follow
// the subscribes queued before it, or refuses it.
func (s *Service) queueSubscribe(c *conn, m *protocol.ClientMessage) {
	m2 := *m
	fn := func(ctx context.Context) { s.subscribe(ctx, c, &m2) }
	if m.Type == protocol.TypeUnsubscribe {
		fn = func(context.Context) { s.unsubscribe(c, &m2) }
	}
	if !s.enqueue(c, fn) {
		s.metrics.msgsIn.WithLabelValues("rate_limited").Inc()
		s.sendError(c, m.ID, protocol.CodeRateLimited, fmt.Sprintf("too many requests in progress: at most %d wait for an answer", maxQueued))
	}
}

// setCustom takes the custom status the user of c set, as setStatus
// takes a status: at once, in order, the newest one written.
func (s *Service) setCustom(c *conn, m *protocol.ClientMessage) {
	custom, err := presence.ParseCustom(m.Text, m.Emoji, m.ExpiresAt, time.Now())
	if err != nil {
		s.sendError(c, m.ID, protocol.CodeInvalidCustom, err.Error())
		return
	}
	s.awaitWritten(c, m.ID, "custom status", s.keys.setCustom(c, custom))
}

// setStatus takes the status the user of c chose. The choice counts at
// once, in the order the client sent it: the newest one is what gets
// written, whatever the writes before it did. A write that takes longer
// than requestTimeout is told to the client as unavailable, though the
// choice stays and is written once NATS answers; with too many requests
// waiting, it is not waited for.
func (s *Service) setStatus(c *conn, m *protocol.ClientMessage) {
	st, err := presence.ParseChosen(m.Status)
	if err != nil {
		s.sendError(c, m.ID, protocol.CodeInvalidStatus, err.Error())
		return
	}
	s.awaitWritten(c, m.ID, "status", s.keys.choose(c, st))
}

// awaitWritten waits, among c's requests, for the write of a choice
// (what names it), and tells the client unavailable, with id, if it was
// not written within requestTimeout: the choice stays, and is written
// once NATS answers. With too many requests waiting it is not waited for.
func (s *Service) awaitWritten(c *conn, id, what string, written <-chan presence.Write) {
	s.enqueue(c, func(ctx context.Context) {
		select {
		case <-written:
		case <-ctx.Done():
			if !c.open() {
				return
			}
			s.log.Warn(what+" not written in time", "user_id", c.userID, "conn_id", c.connID, "err", ctx.Err())
			s.sendError(c, id, protocol.CodeUnavailable, "presence state is unavailable right now: the "+what+" is kept, and written once it is back")
		}
	})
}
