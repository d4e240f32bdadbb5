package gateway

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway/internal/authz"
	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/gateway/internal/outbox"
	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// conn is one client connection: who it is, its socket, what waits to be
// written to it, and its registration in NATS. It has one job of its own,
// tying these together; each part does its own work:
//
//   - sock (package socket) reads and writes frames and closes the socket;
//   - box (package outbox) holds the changes that wait for the socket,
//     written by the service's scheduler;
//   - key is the connection's registration in NATS (registrar);
//   - its subscriptions are the hub's, and its authorization the
//     authorizer's.
//
// An idle conn owns no goroutine and no buffer: the poller says when its
// socket is readable, and a short-lived goroutine reads what arrived.
type conn struct {
	env    *connEnv
	tag    uint64 // the poller's tag and the registry's key
	connID string
	userID string
	device string
	since  int64 // unix ms

	sock *socket.Conn
	box  outbox.Box
	// key is the connection's registration, and us its user's state, both
	// the registrar's.
	key connKey
	us  *userState

	// pollMu orders registering the socket with the pollers (polled: the
	// readable one; wpolled: the writable one, once the socket stalled),
	// resuming it, and removing it before it is closed, so that a closed
	// descriptor's number, reused by a new socket, is never touched.
	// rpaused says it is not read while it is stalled.
	pollMu  sync.Mutex
	fd      int32
	polled  bool
	wpolled bool
	rpaused bool
	// msg is the state of the message in fragments being read (msgOpen,
	// msgRefused); it is the reading goroutine's, as limiter is.
	msg msgState
	// due is the tick on which the gateway's dueRing looks at it next; 0
	// while none will. Under the ring's lock.
	due int64

	lastFrame    atomic.Int64                    // unix ns of the newest frame from the client
	lastActivity atomic.Int64                    // unix ns of the newest sign of use
	expires      atomic.Int64                    // unix ns when its token expires; 0 for none
	watch        atomic.Pointer[authz.WatchList] // its token's watch claim (policy token)
	closed       atomic.Bool
	// idle mirrors key.idle, to be read without the user's lock.
	idle atomic.Bool

	// limiter, roomLimiter (room_update) and signalLimiter (typing,
	// signal) are owned by the goroutine reading the socket.
	limiter, roomLimiter, signalLimiter socket.Limiter
	// roomGrant says which rooms it may join; rooms are those it joined.
	roomGrant atomic.Pointer[roomGrant]
	rooms     connRooms
	// reqs are its messages waiting for NATS.
	reqs requests
}

// connEnv is what every conn needs of its gateway, shared by all of them:
// where its frames go when decoded, who writes its changes, and how it
// ends.
type connEnv struct {
	handler frameHandler
	// flushRooms writes the connection's room frames (memberships.flush).
	flushRooms func(c *conn, buf []byte) []byte
	scheduler  *outbox.Scheduler
	metrics    *gatewayMetrics
	// end closes a connection (Service.end).
	end func(c *conn, kind endKind, code ws.StatusCode, reason string)
	// stalled has the socket's backlog written once the socket can take
	// it (sockets.stalled).
	stalled func(c *conn)
}

// frameHandler handles what a conn's socket decodes.
type frameHandler interface {
	message(c *conn, payload []byte) bool
	fragment(c *conn) bool
	control(c *conn, op ws.OpCode, payload []byte) bool
}

// msgState is what a connection knows of the message in fragments its
// client is sending: whether one is open, and whether one of its frames
// was refused by the rate limit (the message is then dropped).
type msgState uint8

const (
	msgOpen msgState = 1 << iota
	msgRefused
)

// endKind says how a connection ended, which decides what happens to its
// key.
type endKind uint8

const (
	// endClean: the socket closed (a close frame, EOF, a policy close, a
	// drain). The connection lives out the offline grace.
	endClean endKind = iota
	// endDead: no frame for the TTL. The connection ends at once.
	endDead
	// endFailed: the connection never fully started. It ends at once.
	endFailed
)

var (
	_ socket.Sink    = (*conn)(nil)
	_ hub.Watcher    = (*conn)(nil)
	_ outbox.Flusher = (*conn)(nil)
)

// Message handles a text message from the client (socket.Sink).
func (c *conn) Message(payload []byte) bool { return c.env.handler.message(c, payload) }

// Fragment handles a frame of a message in fragments but its last
// (socket.Sink).
func (c *conn) Fragment([]byte) bool { return c.env.handler.fragment(c) }

// Control handles a control frame from the client (socket.Sink).
func (c *conn) Control(op ws.OpCode, payload []byte) bool {
	return c.env.handler.control(c, op, payload)
}

// UserID returns the connection's user (hub.Watcher).
func (c *conn) UserID() string { return c.userID }

// WatchList returns the watch claim of the connection's token
// (authz.ListHolder).
func (c *conn) WatchList() *authz.WatchList { return c.watch.Load() }

// Closed reports whether the connection ended (hub.Watcher).
func (c *conn) Closed() bool { return c.closed.Load() }

// open reports whether the connection has not ended.
func (c *conn) open() bool { return !c.closed.Load() }

// Deliver queues a change of a watched user (hub.Watcher).
func (c *conn) Deliver(p presence.Presence, at int64) {
	if c.box.Add(p, at) {
		c.schedule()
	}
}

// deliverSelf queues the user's own state at status revision rev.
func (c *conn) deliverSelf(rev uint64, status presence.Status, devices int, custom *presence.Custom) {
	if c.box.AddSelf(rev, status, devices, custom) {
		c.schedule()
	}
}

// schedule hands c to the scheduler, which its box said to do.
func (c *conn) schedule() {
	paced, written := c.box.Paced()
	c.env.scheduler.Schedule(c, paced, written)
}

// release ends a hold of the box (see outbox.Box.Hold).
func (c *conn) release() {
	if c.box.Release() {
		c.schedule()
	}
}

// Flush writes what waits for the socket: a self frame if the user's own
// state changed, and one presence_batch frame (outbox.Flusher).
func (c *conn) Flush(buf []byte) ([]byte, bool) {
	if c.closed.Load() {
		c.box.Take(0, 0)
		return buf, true
	}
	if !c.sock.TryLock() {
		return buf, false // busy with a reply or a slow write
	}
	defer c.sock.Unlock()
	return c.flushLocked(buf), true
}

// flushLocked writes what waits for the socket, whose lock the caller
// holds, in one write to the kernel; buf is scratch space, returned for
// reuse.
func (c *conn) flushLocked(buf []byte) []byte {
	c.sock.CorkLocked(nil)
	buf = c.flushFramesLocked(buf)
	c.wrote(c.sock.UncorkLocked())
	return buf
}

// flushFramesLocked writes the frames of flushLocked.
func (c *conn) flushFramesLocked(buf []byte) []byte {
	updates, self, oldest, rooms := c.box.Take(nowNano(), c.env.scheduler.Pace())
	m := c.env.metrics
	if self.Pending {
		buf = protocol.AppendSelf(buf[:0], self.Status, int(self.Devices), self.Custom)
		if !c.writeLocked(buf) {
			return buf
		}
		m.sentSelf.Inc()
	}
	if len(updates) > 0 {
		buf = protocol.AppendBatch(buf[:0], updates)
		if !c.writeLocked(buf) {
			return buf
		}
		m.sentBatch.Inc()
		if oldest != 0 {
			m.propagation.Observe(float64(nowNano()/1e6-oldest) / 1e3)
		}
	}
	if rooms {
		buf = c.env.flushRooms(c, buf)
	}
	return buf
}

// writeLocked writes one text frame, whose bytes the caller may reuse once
// it returns, and reports whether it was written (or waits in the
// socket's backlog); the caller holds the socket's write lock. A failed
// write ends the connection.
func (c *conn) writeLocked(payload []byte) bool {
	stalled, err := c.sock.WriteTextLocked(payload)
	return c.wrote(stalled, err)
}

// wrote handles the outcome of a write to the socket, whose lock the
// caller holds: a failure ends the connection, and a write that started
// the socket's backlog has it written later (see sockets.stalled). It
// reports whether the write did not fail.
func (c *conn) wrote(stalled bool, err error) bool {
	if err != nil {
		c.writeFailed(err)
		return false
	}
	if stalled {
		c.env.stalled(c)
	}
	return true
}

// writeFailed counts a failed write and ends the connection, whose frame
// stream is now cut: as too slow when the write's deadline passed.
func (c *conn) writeFailed(err error) {
	if c.closed.Load() {
		return
	}
	c.env.metrics.writeErrors.Add(1)
	reason := "write failed"
	if socket.IsTimeout(err) {
		c.env.metrics.slowCloses.Inc()
		reason = "too slow: write timed out"
		if errors.Is(err, socket.ErrTooSlow) || errors.Is(err, socket.ErrStalled) {
			reason = "too slow: " + err.Error()
		}
	}
	c.env.end(c, endClean, 0, reason)
}

// nowNano returns the time in unix nanoseconds.
func nowNano() int64 { return time.Now().UnixNano() }
