package socket

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/internal/netpoll"
	"golang.org/x/sys/unix"
)

// Conn is the transport of one WebSocket connection after its upgrade: it
// reads client frames into a Decoder, writes server frames one at a time,
// and closes the connection as RFC 6455 asks.
//
// Writes are serialized by a write lock that callers may also hold across
// several frames (Lock, WriteTextLocked, Unlock), so that a reply is never
// overtaken. One goroutine reads at a time. Close may be called from any
// goroutine, once; after it every write fails with net.ErrClosed.
//
// A socket held by its descriptor alone (a netpoll.Conn, which has
// WriteNow) is never waited for: a write gives the kernel what it takes
// now and keeps the rest, with every frame written after it, in the
// socket's backlog, in order. The write that starts a backlog says so
// (stalled); its owner then has a writable poller report the socket and
// calls Drain, until the backlog is written; Stalled says since when the
// socket took nothing, for the owner to close one that takes nothing for
// too long. Other sockets' writes wait, up to the write timeout.
type Conn struct {
	nc           net.Conn
	raw          syscall.RawConn // nil when nc has no descriptor
	writeTimeout time.Duration

	wmu    sync.Mutex
	closed atomic.Bool
	// deflate says permessage-deflate was negotiated (Deflate); set
	// before the socket is used.
	deflate bool
	// cork holds what the writes made while the socket is corked wrote,
	// to be written at once when it is uncorked; corks counts the corks
	// not yet undone. Both are guarded by wmu.
	cork  *bytes.Buffer
	corks int
	// out is what waits for the kernel to take it; nil when nothing does.
	// It is set and changed under wmu, and read without it by Stalled.
	out atomic.Pointer[backlog]

	// rmu is held by the goroutine reading the socket. A poller hands a
	// socket to one reader at a time, but through the kernel; the mutex
	// makes each reader see what the previous one left.
	rmu sync.Mutex
	dec Decoder
}

// backlog is what a socket's writes left for the kernel to take.
type backlog struct {
	buf []byte
	// since is when the socket last took some of it (or the backlog
	// began), unix ns.
	since atomic.Int64
}

// nowWriter is a socket that can be written without waiting.
type nowWriter interface {
	WriteNow(b []byte) (int, error)
}

// MaxBacklog bounds a socket's backlog: a frame that would make it larger
// fails with ErrTooSlow. (The frame that starts a backlog is always taken,
// whatever its size.)
const MaxBacklog = 1 << 20

// Errors of a socket too slow for its owner to keep (see IsTimeout).
var (
	// ErrTooSlow is the error of a write that would make a socket's
	// backlog larger than MaxBacklog: its peer reads far slower than it
	// is written to.
	ErrTooSlow = errors.New("more than 1 MiB waits to be written")
	// ErrStalled is for the owner of a socket that took nothing of its
	// backlog for too long (see Stalled).
	ErrStalled = errors.New("nothing written for the write timeout")
)

// New returns the transport of an upgraded connection. Where nc cannot be
// written without waiting (see Conn), writes that take longer than
// writeTimeout fail (the peer does not read). The Conn owns nc and closes
// it in Close.
func New(nc net.Conn, writeTimeout time.Duration) *Conn {
	c := &Conn{nc: nc, writeTimeout: writeTimeout}
	if sc, ok := nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	return c
}

// Deflate has the socket speak permessage-deflate (RFC 7692), negotiated
// with no context takeover either way: text messages of DeflateMin bytes
// or more are written compressed (RSV1 set) when that makes them smaller,
// and the client's compressed messages are inflated (Decoder.Deflate). It
// is called before the socket is first written or read.
func (c *Conn) Deflate() {
	c.deflate = true
	c.dec.Deflate()
}

// Fd returns the socket's file descriptor, for a poller; false when it
// has none or is closed.
func (c *Conn) Fd() (int, bool) {
	if c.raw == nil {
		return 0, false
	}
	fd := -1
	if err := c.raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return 0, false
	}
	return fd, true
}

// Closed reports whether Close was called.
func (c *Conn) Closed() bool { return c.closed.Load() }

// ReadReady reads what the socket holds, without blocking, into rb, and
// passes each message and control frame to sink. The socket must have a
// descriptor (Fd) and have been reported readable. It returns nil when the
// connection stays open; io.EOF when the peer hung up or reset it without
// a close frame; a *FrameError for a protocol violation; or the error of
// the socket.
func (c *Conn) ReadReady(rb *ReadBuffer, maxMsg int, sink Sink) error {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	err := c.raw.Read(rb.fn)
	n, rerr := rb.n, rb.err
	rb.err = nil
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return io.EOF // the peer hung up, or the socket failed: gone
	case n == 0:
		return nil // nothing now
	}
	return c.dec.Decode(rb.buf[:n], maxMsg, sink)
}

// ReadBuffer is what one reading goroutine reads sockets into with
// ReadReady: a buffer, and the state of a read of a descriptor whose
// function (for RawConn.Read) is made once, so that a read allocates
// nothing. It is not safe for concurrent use.
type ReadBuffer struct {
	buf []byte
	n   int
	err error
	fn  func(fd uintptr) bool
}

// NewReadBuffer returns a ReadBuffer of size bytes.
func NewReadBuffer(size int) *ReadBuffer {
	rb := &ReadBuffer{buf: make([]byte, size)}
	rb.fn = rb.read
	return rb
}

func (rb *ReadBuffer) read(fd uintptr) bool {
	rb.n, rb.err = netpoll.ReadNow(int(fd), rb.buf)
	return true
}

// ReadLoop reads the socket with blocking reads into buf until the
// connection ends or sink asks to stop, and returns why it ended (as
// ReadReady does; nil when sink stopped it). It is for platforms without a
// poller, where each connection has a reading goroutine.
func (c *Conn) ReadLoop(buf []byte, maxMsg int, sink Sink) error {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	stop := &stopSink{Sink: sink}
	for {
		n, err := c.nc.Read(buf)
		if n > 0 {
			if derr := c.dec.Decode(buf[:n], maxMsg, stop); derr != nil {
				return derr
			}
			if stop.stopped || c.closed.Load() {
				return nil
			}
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
				return io.EOF
			}
			return err
		}
	}
}

// stopSink remembers that its sink asked to stop.
type stopSink struct {
	Sink
	stopped bool
}

func (s *stopSink) Message(p []byte) bool {
	ok := s.Sink.Message(p)
	s.stopped = s.stopped || !ok
	return ok
}

func (s *stopSink) Fragment(p []byte) bool {
	ok := s.Sink.Fragment(p)
	s.stopped = s.stopped || !ok
	return ok
}

func (s *stopSink) Control(op ws.OpCode, p []byte) bool {
	ok := s.Sink.Control(op, p)
	s.stopped = s.stopped || !ok
	return ok
}

var framePool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Lock takes the write lock, to write several frames in a row with
// WriteTextLocked.
func (c *Conn) Lock() { c.wmu.Lock() }

// TryLock takes the write lock if it is free, and reports whether it did.
func (c *Conn) TryLock() bool { return c.wmu.TryLock() }

// Unlock releases the write lock.
func (c *Conn) Unlock() { c.wmu.Unlock() }

// WriteText writes one text frame (see WriteTextLocked).
func (c *Conn) WriteText(payload []byte) (stalled bool, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.WriteTextLocked(payload)
}

// WriteTextLocked writes one text frame; the caller holds the write lock.
// stalled reports that the socket did not take all of it, and that the
// rest waits in its backlog, which this write started (see Conn). A write
// that fails leaves the frame stream cut: the caller closes the
// connection (code 0). A socket too slow (the write's deadline passing,
// or ErrTooSlow) fails with an error for which IsTimeout is true.
func (c *Conn) WriteTextLocked(payload []byte) (stalled bool, err error) {
	if c.closed.Load() {
		return false, net.ErrClosed
	}
	fb := framePool.Get().(*bytes.Buffer)
	fb.Reset()
	h := ws.Header{Fin: true, OpCode: ws.OpText, Length: int64(len(payload))}
	var zb *bytes.Buffer
	if c.deflate && len(payload) >= DeflateMin {
		zb = framePool.Get().(*bytes.Buffer)
		zb.Reset()
		if z := Compress(zb, payload); len(z) < len(payload) {
			payload = z
			h.Length = int64(len(z))
			h.Rsv = ws.Rsv(true, false, false)
		}
	}
	_ = ws.WriteHeader(fb, h)
	fb.Write(payload)
	stalled, err = c.writeLocked(fb.Bytes())
	if fb.Cap() <= 64<<10 {
		framePool.Put(fb)
	}
	if zb != nil && zb.Cap() <= 64<<10 {
		framePool.Put(zb)
	}
	return stalled, err
}

// WriteControlLocked writes a control frame (a pong), after what waits in
// the backlog (see WriteTextLocked); the caller holds the write lock. A
// pong is never dropped, and a peer that sends pings faster than it reads
// fills its socket until it is too slow, not the server's memory.
func (c *Conn) WriteControlLocked(op ws.OpCode, payload []byte) (stalled bool, err error) {
	if c.closed.Load() {
		return false, net.ErrClosed
	}
	var b [ws.MaxHeaderSize + ws.MaxControlFramePayloadSize]byte
	buf := bytes.NewBuffer(b[:0])
	_ = ws.WriteFrame(buf, ws.NewFrame(op, true, payload))
	return c.writeLocked(buf.Bytes())
}

// CorkLocked holds the frames written from now on, after prefix (bytes
// to go first, such as the answer to the upgrade), until as many
// UncorkLocked as CorkLocked: they are then written to the kernel in one
// write, where each frame would have been a write (a system call, and on
// loopback the peer's receipt) of its own. The caller holds the write
// lock, and uncorks before it releases it.
func (c *Conn) CorkLocked(prefix []byte) {
	if c.corks == 0 {
		c.cork = framePool.Get().(*bytes.Buffer)
		c.cork.Reset()
	}
	c.corks++
	c.cork.Write(prefix)
}

// UncorkLocked undoes one CorkLocked; the last writes what the corked
// writes held, and reports it as WriteTextLocked does (a failure of any
// of them shows here). The caller holds the write lock.
func (c *Conn) UncorkLocked() (stalled bool, err error) {
	if c.corks == 0 {
		return false, nil
	}
	c.corks--
	if c.corks > 0 {
		return false, nil
	}
	fb := c.cork
	c.cork = nil
	if fb.Len() > 0 {
		if c.closed.Load() {
			err = net.ErrClosed
		} else {
			stalled, err = c.writeLocked(fb.Bytes())
		}
	}
	if fb.Cap() <= 64<<10 {
		framePool.Put(fb)
	}
	return stalled, err
}

// writeLocked writes the bytes of whole frames, b, which the caller may
// reuse once it returns; the caller holds the write lock. See
// WriteTextLocked. While the socket is corked, they are kept for its
// uncorking.
func (c *Conn) writeLocked(b []byte) (stalled bool, err error) {
	if c.corks > 0 {
		if c.cork.Len()+len(b) > MaxBacklog {
			return false, ErrTooSlow
		}
		c.cork.Write(b)
		return false, nil
	}
	nw, ok := c.nc.(nowWriter)
	if !ok {
		return false, c.writeRaw(b, c.writeTimeout)
	}
	if o := c.out.Load(); o != nil {
		if len(o.buf)+len(b) > MaxBacklog {
			return false, ErrTooSlow
		}
		o.buf = append(o.buf, b...)
		return false, nil
	}
	n, err := nw.WriteNow(b)
	if err != nil || n == len(b) {
		return false, err
	}
	o := &backlog{buf: append([]byte(nil), b[n:]...)}
	o.since.Store(time.Now().UnixNano())
	c.out.Store(o)
	return true, nil
}

// Drain writes what the kernel takes now of the socket's backlog, and
// reports whether the backlog is written; the caller holds the write lock.
// An error ends the connection as a failed write does.
func (c *Conn) Drain() (done bool, err error) {
	o := c.out.Load()
	if o == nil {
		return true, nil
	}
	if c.closed.Load() {
		return false, net.ErrClosed
	}
	n, err := c.nc.(nowWriter).WriteNow(o.buf)
	switch {
	case err != nil:
		return false, err
	case n == len(o.buf):
		c.out.Store(nil)
		return true, nil
	case n > 0:
		o.buf = o.buf[n:]
		o.since.Store(time.Now().UnixNano())
	}
	return false, nil
}

// Backlog returns how many bytes wait in the socket's backlog.
func (c *Conn) Backlog() int {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if o := c.out.Load(); o != nil {
		return len(o.buf)
	}
	return 0
}

// Stalled returns since when the socket has taken nothing of its backlog
// (unix ns), or 0 when it has none. It is safe to call without the write
// lock.
func (c *Conn) Stalled() int64 {
	if o := c.out.Load(); o != nil {
		return o.since.Load()
	}
	return 0
}

// writeRaw writes b with a deadline; the caller holds the write lock.
func (c *Conn) writeRaw(b []byte, timeout time.Duration) error {
	if err := c.nc.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	_, err := c.nc.Write(b)
	return err
}

// IsTimeout reports whether err says the socket is too slow: a write
// deadline passing, ErrTooSlow or ErrStalled.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, ErrTooSlow) || errors.Is(err, ErrStalled) || errors.As(err, &ne) && ne.Timeout()
}

// Close ends the connection, once, and reports whether this call did.
//
// With code 0 the socket is closed at once: the peer is gone, or the
// frame stream is cut. Otherwise the connection is closed as RFC 6455
// §7.1.1 asks: after any write in progress and what waits in the backlog,
// a close frame with code and reason is sent, the write side is shut down, and what the peer still
// sends is read and thrown away until its own close frame or the end of
// its stream, within l's bounds of time and bytes; only then is the socket
// closed. Closing a socket with unread data makes the kernel answer with
// a reset, which would destroy the close frame (and the error frames
// before it) before the peer reads them. That part runs in the background
// under l; when l is full or stopped, the socket is closed after a quick
// read of what is already buffered (and with no close frame when its
// backlog waits: its peer does not read).
func (c *Conn) Close(code ws.StatusCode, reason string, l *Linger) bool {
	if c.closed.Swap(true) {
		return false
	}
	if code == 0 {
		_ = c.nc.Close()
		return true
	}
	if l.start(func() { c.linger(code, reason, l) }) {
		return true
	}
	if c.wmu.TryLock() {
		if c.out.Load() == nil { // a peer that does not read gets no close frame
			c.writeClose(code, reason)
		}
		c.wmu.Unlock()
		c.closeWrite()
		if c.rmu.TryLock() {
			c.discardBuffered()
			c.rmu.Unlock()
		}
	}
	_ = c.nc.Close()
	return true
}

// linger sends the close frame, waits for the peer's, and closes.
func (c *Conn) linger(code ws.StatusCode, reason string, l *Linger) {
	defer func() { _ = c.nc.Close() }()
	c.wmu.Lock()
	c.writeClose(code, reason)
	c.wmu.Unlock()
	c.closeWrite()
	// The deadline also ends a ReadLoop blocked on the socket, so that
	// the read lock comes free.
	if err := c.nc.SetReadDeadline(time.Now().Add(l.timeout)); err != nil {
		return
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	buf := make([]byte, 4096)
	sink := &closeSink{}
	decoding := true // until the stream cannot be decoded: then until EOF
	for budget := l.budget; budget > 0 && !sink.closed; {
		n, err := c.nc.Read(buf[:min(len(buf), budget)])
		budget -= n
		if n > 0 && decoding && c.dec.Decode(buf[:n], l.maxMsg, sink) != nil {
			decoding = false
		}
		if err != nil {
			return
		}
	}
}

// writeClose writes what waits in the backlog and a close frame, within a
// second; the caller holds the write lock. Its error is of no use: the
// socket is closed next.
func (c *Conn) writeClose(code ws.StatusCode, reason string) {
	if err := c.nc.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
		return
	}
	if o := c.out.Load(); o != nil {
		if _, err := c.nc.Write(o.buf); err != nil {
			return
		}
		c.out.Store(nil)
	}
	var b [ws.MaxHeaderSize + ws.MaxControlFramePayloadSize]byte
	buf := bytes.NewBuffer(b[:0])
	_ = ws.WriteFrame(buf, ws.NewCloseFrame(ws.NewCloseFrameBody(code, reason)))
	_, _ = c.nc.Write(buf.Bytes())
}

// closeWrite shuts the write side down: the peer reads the close frame and
// then the end of the stream.
func (c *Conn) closeWrite() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	if c.raw != nil {
		_ = c.raw.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_WR) })
	}
}

// discardBuffered reads, without blocking, what the kernel already holds
// for the socket; the caller holds the read lock.
func (c *Conn) discardBuffered() {
	if c.raw == nil {
		return
	}
	var buf [4096]byte
	for range 256 {
		n := 0
		_ = c.raw.Read(func(fd uintptr) bool {
			n, _ = netpoll.ReadNow(int(fd), buf[:])
			return true
		})
		if n <= 0 {
			return
		}
	}
}

// closeSink ignores messages and notes the peer's close frame.
type closeSink struct{ closed bool }

func (s *closeSink) Message([]byte) bool  { return true }
func (s *closeSink) Fragment([]byte) bool { return true }

func (s *closeSink) Control(op ws.OpCode, _ []byte) bool {
	if op == ws.OpClose {
		s.closed = true
		return false
	}
	return true
}
