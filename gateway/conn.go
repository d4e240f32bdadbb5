package gateway

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/pkg/presence"
)

// conn is one client WebSocket and its connection key in presence_conns.
//
// An idle conn owns no goroutine and no buffer: the poller tells when its
// socket is readable, a short-lived goroutine reads what arrived, and the
// flusher writes what is pending for it once per batch interval.
type conn struct {
	s      *Service
	tag    uint64 // the poller's tag and the registry's key
	connID string
	userID string
	device string
	since  int64 // unix ms
	nc     net.Conn
	raw    syscall.RawConn

	// pollMu orders registering the socket with the poller, resuming it,
	// and removing it before it is closed, so that a closed descriptor's
	// number, reused by a new socket, is never touched.
	pollMu sync.Mutex
	fd     int
	polled bool

	lastFrame    atomic.Int64 // unix ns of the newest frame from the client
	lastActivity atomic.Int64 // unix ns of the newest sign of use
	expires      atomic.Int64 // unix ns when its token expires; 0 for none
	writtenAt    atomic.Int64 // unix ns of the newest key write
	closed       atomic.Bool

	// readMu is held by the goroutine reading the socket. The poller
	// hands a socket to one reader at a time, but through the kernel; the
	// mutex makes each reader see what the previous one left.
	readMu sync.Mutex
	// Reading state, guarded by readMu.
	dec     decoder
	tokens  float32 // rate limiter bucket
	tokenAt int64   // unix ns of the last refill
	strikes uint8   // rate_limited errors in the current strike window
	strikeW int64   // unix ns when the strike window started

	// wmu serializes writes to the socket.
	wmu sync.Mutex

	// kvMu is held while a write of the connection key is in flight, from
	// the publish to its acknowledgement, so that writes of one key are
	// never concurrent. The fields below it are guarded by it.
	kvMu   sync.Mutex
	rev    uint64 // the key's newest revision
	awayAt int64  // AwayAt of the newest key write, unix ms; 0 while idle
	idle   bool   // the client said idle
	// The write in flight: when it was sent and the away_at it carries.
	flightAt, flightAway int64
	// flightSent is when the write in flight was published (unix ns), for
	// the KV latency metric.
	flightSent int64

	// Delivery state, guarded by pmu.
	pmu     sync.Mutex
	pending []presence.Presence // newest change per watched user
	self    selfState
	queued  bool  // in the flusher's list
	oldest  int64 // unix ms when the oldest pending change was written
	// flushedAt is when the flusher last wrote to the socket (unix ns):
	// the next batch waits until a batch interval after it.
	flushedAt atomic.Int64

	// subs are this socket's subscriptions by target user, guarded by the
	// hub's mutex.
	subs map[string]*watch
}

// selfState is the user's own status as this connection last learned it.
type selfState struct {
	rev     uint64
	status  presence.Status
	devices int
	pending bool
}

// endKind says how a connection ended, which decides what happens to its
// key.
type endKind uint8

const (
	// endClean: the socket closed (a close frame, EOF, a policy close, a
	// drain). The key lives out the offline grace.
	endClean endKind = iota
	// endDead: no frame for the TTL. The key is removed at once.
	endDead
	// endFailed: the connection never fully started. The key is removed.
	endFailed
)

var framePool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// writeText writes one text frame.
func (c *conn) writeText(payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeTextLocked(payload)
}

// writeTextLocked writes one text frame; the caller holds wmu.
func (c *conn) writeTextLocked(payload []byte) error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	fb := framePool.Get().(*bytes.Buffer)
	fb.Reset()
	_ = ws.WriteHeader(fb, ws.Header{Fin: true, OpCode: ws.OpText, Length: int64(len(payload))})
	fb.Write(payload)
	err := c.writeRaw(fb.Bytes(), c.s.cfg.WriteTimeout)
	if fb.Cap() <= 64<<10 {
		framePool.Put(fb)
	}
	if err != nil {
		c.writeFailed(err)
	}
	return err
}

// writeFailed counts a failed write and closes the connection, whose frame
// stream is now cut: as too slow when the write's deadline passed.
func (c *conn) writeFailed(err error) {
	c.s.metrics.writeErrors.Add(1)
	if isTimeout(err) {
		c.s.metrics.slowCloses.Inc()
		go c.end(endClean, 0, "too slow: write timed out")
		return
	}
	go c.end(endClean, 0, "write failed")
}

// writeRaw writes b with a deadline; the caller holds wmu.
func (c *conn) writeRaw(b []byte, timeout time.Duration) error {
	if err := c.nc.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	_, err := c.nc.Write(b)
	return err
}

// writeControl writes a control frame (pong) if the socket is not busy
// with another write; a client that sends pings faster than it reads loses
// pongs, not the gateway's memory.
func (c *conn) writeControl(op ws.OpCode, payload []byte) {
	if !c.wmu.TryLock() {
		return
	}
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return
	}
	var b [ws.MaxHeaderSize + ws.MaxControlFramePayloadSize]byte
	buf := bytes.NewBuffer(b[:0])
	_ = ws.WriteFrame(buf, ws.NewFrame(op, true, payload))
	if err := c.writeRaw(buf.Bytes(), c.s.cfg.WriteTimeout); err != nil {
		c.writeFailed(err)
	}
}

// end closes the connection once: it sends a close frame with code (none
// when code is zero), closes the socket, forgets the connection's
// subscriptions, and settles its key as kind says.
func (c *conn) end(kind endKind, code ws.StatusCode, reason string) {
	if c.closed.Swap(true) {
		return
	}
	s := c.s
	c.pollMu.Lock()
	if c.polled {
		_ = s.poller.Remove(c.fd)
		c.polled = false
	}
	c.pollMu.Unlock()
	s.unwatch(c)
	switch {
	case code == 0:
		_ = c.nc.Close()
	case c.wmu.TryLock():
		c.writeClose(code, reason)
		c.wmu.Unlock()
		_ = c.nc.Close()
	default:
		// A frame is being written: the close frame follows it, so that
		// the client learns why it was closed. Writers after it see the
		// connection closed and write nothing; the one in progress ends
		// within WriteTimeout.
		closeAfter := func() {
			c.wmu.Lock()
			c.writeClose(code, reason)
			c.wmu.Unlock()
			_ = c.nc.Close()
		}
		if !s.bg.Go(closeAfter) {
			go closeAfter()
		}
	}
	s.hub.removeConn(c)
	s.registry.remove(c)
	s.metrics.closes(kind, code)
	if s.log.Enabled(s.ctx, levelDebug) {
		s.log.LogAttrs(s.ctx, levelDebug, "connection closed",
			attrUser(c.userID), attrConn(c.connID), attrReason(reason), attrCode(int(code)))
	}
	settle := func() { s.settle(c, kind) }
	if !s.bg.Go(settle) {
		settle()
	}
}

// writeClose writes a close frame with a short deadline; the caller holds
// wmu.
func (c *conn) writeClose(code ws.StatusCode, reason string) {
	var b [ws.MaxHeaderSize + ws.MaxControlFramePayloadSize]byte
	buf := bytes.NewBuffer(b[:0])
	_ = ws.WriteFrame(buf, ws.NewCloseFrame(ws.NewCloseFrameBody(code, reason)))
	_ = c.writeRaw(buf.Bytes(), time.Second)
}

// isTimeout reports whether err is a write deadline passing: the client
// does not read fast enough.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isClosedErr reports whether err only says the socket is already closed.
func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed)
}
