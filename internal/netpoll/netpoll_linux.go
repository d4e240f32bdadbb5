//go:build linux

package netpoll

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// wakeTag is the tag of the poller's own eventfd; Add must not use it.
const wakeTag = ^uint64(0)

// Supported reports whether this platform has a Poller.
const Supported = true

// Poller waits for many file descriptors to be readable (New) or writable
// (NewWritable). A descriptor is reported once (EPOLLONESHOT) and then not
// again until Resume, so the goroutine reading (or writing) it is the only
// one. A descriptor may be in a Poller of each kind at once. Add, Resume
// and Remove are safe for concurrent use with each other and with Wait;
// Wait must be called from one goroutine at a time.
type Poller struct {
	epfd   int
	wakefd int    // an eventfd that Close writes to, to end a blocked Wait
	events uint32 // what Add and Resume watch for
	closed atomic.Bool
	raw    []unix.EpollEvent
}

// New creates a Poller that reports readable descriptors.
func New() (*Poller, error) { return newPoller(readEvents) }

// NewWritable creates a Poller that reports descriptors with room to
// write: a socket whose peer has read some of what waited in the kernel.
func NewWritable() (*Poller, error) { return newPoller(writeEvents) }

func newPoller(events uint32) (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	setTag(&ev, wakeTag)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &ev); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wakefd)
		return nil, fmt.Errorf("epoll_ctl add eventfd: %w", err)
	}
	return &Poller{epfd: epfd, wakefd: wakefd, events: events, raw: make([]unix.EpollEvent, 256)}, nil
}

const (
	readEvents  = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT
	writeEvents = unix.EPOLLOUT | unix.EPOLLONESHOT
)

// Add starts watching fd, reporting it once with tag, which must not be the
// largest uint64.
func (p *Poller) Add(fd int, tag uint64) error {
	ev := unix.EpollEvent{Events: p.events}
	setTag(&ev, tag)
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl add: %w", err)
	}
	return nil
}

// Resume reports fd once more when it is ready, after its reader (or
// writer) is done with what the last report announced.
func (p *Poller) Resume(fd int, tag uint64) error {
	ev := unix.EpollEvent{Events: p.events}
	setTag(&ev, tag)
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl mod: %w", err)
	}
	return nil
}

// Remove stops watching fd. Call it before closing fd.
func (p *Poller) Remove(fd int) error {
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBADF) {
		return fmt.Errorf("epoll_ctl del: %w", err)
	}
	return nil
}

// Wait blocks until at least one descriptor is ready or msec
// milliseconds pass (-1 waits forever), and appends the events to dst.
func (p *Poller) Wait(dst []Event, msec int) ([]Event, error) {
	for {
		if p.closed.Load() {
			return dst, ErrClosed
		}
		n, err := unix.EpollWait(p.epfd, p.raw, msec)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return dst, fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range p.raw[:n] {
			if tagOf(&ev) == wakeTag {
				continue
			}
			dst = append(dst, Event{
				Tag:    tagOf(&ev),
				Hangup: ev.Events&(unix.EPOLLHUP|unix.EPOLLRDHUP|unix.EPOLLERR) != 0,
			})
		}
		if p.closed.Load() {
			return dst, ErrClosed
		}
		return dst, nil
	}
}

// Close wakes a blocked Wait and releases the epoll instance. Descriptors
// still added are not closed.
func (p *Poller) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	var one [8]byte
	one[0] = 1
	_, _ = unix.Write(p.wakefd, one[:])
	return nil
}

// Release frees the poller's own descriptors; call it after the goroutine
// that called Wait has returned.
func (p *Poller) Release() error {
	return errors.Join(unix.Close(p.epfd), unix.Close(p.wakefd))
}

// ReadNow reads what the socket fd holds into b, without waiting: n > 0
// bytes; 0 and nil when it holds nothing now (or b is empty); 0 and io.EOF
// when the peer closed it; or the read's error, an *os.SyscallError. It is
// the read of a socket the poller reported readable.
func ReadNow(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Read(fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, nil
		case err != nil:
			return 0, os.NewSyscallError("read", err)
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// WriteNow writes as much of b as the socket fd takes now, without
// waiting: n bytes (0 when it has no room); or the write's error, an
// *os.SyscallError. What is not written waits for a writable Poller to
// report fd.
func WriteNow(fd int, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := unix.Write(fd, b[n:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return n, nil
		case err != nil:
			return n, os.NewSyscallError("write", err)
		}
		n += m
	}
	return n, nil
}
