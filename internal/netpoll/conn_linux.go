//go:build linux

package netpoll

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Conn is a TCP socket held by its file descriptor alone, outside the Go
// runtime's network poller: for a socket watched by a Poller, it drops what
// a *net.TCPConn keeps per socket (the runtime's poll descriptor, the
// net.FD and both addresses), about 900 bytes in all. Reads and writes
// that would block wait in poll(2) on this one descriptor, bounded by the
// deadlines.
//
// Close may be called concurrently with Read and Write: it shuts the socket
// down, which wakes them, and closes the descriptor only once they have
// returned, so the number is never reused under an operation in progress.
type Conn struct {
	fd     int32
	closed atomic.Bool
	// mu is held for reading by every operation on fd, and for writing by
	// Close while it closes fd.
	mu sync.RWMutex
	// Deadlines as unix nanoseconds; zero for none.
	rdl, wdl atomic.Int64
}

var (
	_ net.Conn     = (*Conn)(nil)
	_ syscall.Conn = (*Conn)(nil)
)

// Detach takes the socket of nc (a *net.TCPConn or another syscall.Conn)
// out of the runtime poller: it duplicates the descriptor, closes nc, and
// returns a *Conn of the duplicate. The socket must be in non-blocking
// mode, as Go's sockets are. On an error nc is left open.
func Detach(nc net.Conn) (net.Conn, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("netpoll: %T has no file descriptor", nc)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var dupErr error
	if err := raw.Control(func(f uintptr) { fd, dupErr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, os.NewSyscallError("fcntl", dupErr)
	}
	if err := nc.Close(); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return &Conn{fd: int32(fd)}, nil
}

// acquire takes a reference for one operation; false once closed.
func (c *Conn) acquire() bool {
	c.mu.RLock()
	if c.closed.Load() {
		c.mu.RUnlock()
		return false
	}
	return true
}

// Read reads into b, waiting for data until the read deadline.
func (c *Conn) Read(b []byte) (int, error) {
	if !c.acquire() {
		return 0, net.ErrClosed
	}
	defer c.mu.RUnlock()
	for {
		n, err := ReadNow(int(c.fd), b)
		switch {
		case err == io.EOF:
			return 0, io.EOF
		case err != nil:
			return 0, &net.OpError{Op: "read", Net: "tcp", Err: err}
		case n > 0 || len(b) == 0:
			return n, nil
		}
		if err := c.wait(unix.POLLIN, c.rdl.Load()); err != nil {
			return 0, err
		}
	}
}

// Write writes all of b, waiting for room until the write deadline. It
// returns how much was written before an error.
func (c *Conn) Write(b []byte) (int, error) {
	if !c.acquire() {
		return 0, net.ErrClosed
	}
	defer c.mu.RUnlock()
	n := 0
	for n < len(b) {
		m, err := unix.Write(int(c.fd), b[n:])
		if m > 0 {
			n += m
		}
		switch err {
		case nil:
		case unix.EINTR:
		case unix.EAGAIN:
			if err := c.wait(unix.POLLOUT, c.wdl.Load()); err != nil {
				return n, err
			}
		default:
			return n, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", err)}
		}
	}
	return n, nil
}

// WriteNow writes as much of b as the socket takes now, without waiting
// (see the package's WriteNow): 0 bytes when it has no room.
func (c *Conn) WriteNow(b []byte) (int, error) {
	if !c.acquire() {
		return 0, net.ErrClosed
	}
	defer c.mu.RUnlock()
	n, err := WriteNow(int(c.fd), b)
	if err != nil {
		return n, &net.OpError{Op: "write", Net: "tcp", Err: err}
	}
	return n, nil
}

// wait blocks in poll(2) until the descriptor is ready for events, the
// deadline (unix ns, 0 for none) passes, or the Conn is closed.
func (c *Conn) wait(events int16, deadline int64) error {
	for {
		timeout := -1
		if deadline != 0 {
			left := time.Until(time.Unix(0, deadline))
			if left <= 0 {
				return os.ErrDeadlineExceeded
			}
			timeout = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		fds := [1]unix.PollFd{{Fd: c.fd, Events: events}}
		n, err := unix.Poll(fds[:], timeout)
		if c.closed.Load() {
			return net.ErrClosed
		}
		switch {
		case err == unix.EINTR:
		case err != nil:
			return os.NewSyscallError("poll", err)
		case n > 0:
			// Ready, or hung up or in error: the next call says which.
			return nil
		}
	}
}

// Close shuts the socket down, waits for operations in progress to return,
// and closes the descriptor.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return net.ErrClosed
	}
	// Wake a Read or Write blocked in poll: a shut-down socket is ready.
	_ = unix.Shutdown(int(c.fd), unix.SHUT_RDWR)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := unix.Close(int(c.fd)); err != nil {
		return os.NewSyscallError("close", err)
	}
	return nil
}

// LocalAddr returns the socket's local address, asked of the kernel (a
// Conn does not keep it).
func (c *Conn) LocalAddr() net.Addr { return c.addr(unix.Getsockname) }

// RemoteAddr returns the peer's address, asked of the kernel.
func (c *Conn) RemoteAddr() net.Addr { return c.addr(unix.Getpeername) }

func (c *Conn) addr(get func(int) (unix.Sockaddr, error)) net.Addr {
	if !c.acquire() {
		return &net.TCPAddr{}
	}
	defer c.mu.RUnlock()
	sa, err := get(int(c.fd))
	if err != nil {
		return &net.TCPAddr{}
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]).To16(), Port: sa.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]), Port: sa.Port}
	}
	return &net.TCPAddr{}
}

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	_ = c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline of Read; the zero time means none.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.rdl.Store(deadline(t))
	return nil
}

// SetWriteDeadline sets the deadline of Write; the zero time means none.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.wdl.Store(deadline(t))
	return nil
}

func deadline(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return max(t.UnixNano(), 1)
}

// SyscallConn returns the socket's descriptor for Control and for reads
// and writes that never block (the Poller says when to read).
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return (*rawConn)(c), nil }

// rawConn is a Conn as a syscall.RawConn.
type rawConn Conn

// Control calls f with the descriptor, unless the Conn is closed.
func (r *rawConn) Control(f func(fd uintptr)) error {
	c := (*Conn)(r)
	if !c.acquire() {
		return net.ErrClosed
	}
	defer c.mu.RUnlock()
	f(uintptr(c.fd))
	return nil
}

// Read calls f with the descriptor once: the caller reads without
// blocking, as the Poller told it the socket is readable.
func (r *rawConn) Read(f func(fd uintptr) bool) error {
	return r.Control(func(fd uintptr) { f(fd) })
}

// Write calls f with the descriptor once.
func (r *rawConn) Write(f func(fd uintptr) bool) error {
	return r.Control(func(fd uintptr) { f(fd) })
}
