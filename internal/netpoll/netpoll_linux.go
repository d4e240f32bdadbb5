//go:build linux

package netpoll

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// wakeTag is the tag of the poller's own eventfd; Add must not use it.
const wakeTag = ^uint64(0)

// Supported reports whether this platform has a Poller.
const Supported = true

// Poller waits for readability on many file descriptors. A descriptor is
// reported once (EPOLLONESHOT) and then not again until Resume, so the
// goroutine reading it is the only one. Add, Resume and Remove are safe for
// concurrent use with each other and with Wait; Wait must be called from
// one goroutine at a time.
//
// Wait parks its goroutine in the Go runtime's own poller, which watches
// the epoll descriptor (readable while it holds events), rather than
// blocking a thread in epoll_wait: a thread blocked in a system call keeps
// its scheduler slot busy, and then the runtime's monitor never sleeps
// for long, which cost an idle gateway about a fifth of its CPU.
type Poller struct {
	epfd   int
	file   *os.File        // epfd, as the runtime's poller watches it
	rc     syscall.RawConn // file's
	wakefd int             // an eventfd that Close writes to, to end a blocked Wait
	closed atomic.Bool

	// Wait's own, made once so that a wait allocates nothing.
	raw      []unix.EpollEvent
	n        int
	err      error
	poll     func(uintptr) bool
	deadline bool // a read deadline is set on file
}

// New creates a Poller.
func New() (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	// Non-blocking, so that os.NewFile hands it to the runtime's poller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("epoll descriptor non-blocking: %w", err)
	}
	file := os.NewFile(uintptr(epfd), "epoll")
	rc, err := file.SyscallConn()
	if err != nil {
		_ = file.Close()
		return nil, fmt.Errorf("epoll descriptor: %w", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = file.Close()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	setTag(&ev, wakeTag)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &ev); err != nil {
		_ = file.Close()
		_ = unix.Close(wakefd)
		return nil, fmt.Errorf("epoll_ctl add eventfd: %w", err)
	}
	p := &Poller{epfd: epfd, file: file, rc: rc, wakefd: wakefd, raw: make([]unix.EpollEvent, 256)}
	p.poll = p.pollNow
	return p, nil
}

// pollNow takes the events epoll holds, without waiting, and reports
// whether there were any (or an error): if not, the runtime parks the
// goroutine in Wait until the epoll descriptor is readable.
func (p *Poller) pollNow(uintptr) bool {
	p.n, p.err = unix.EpollWait(p.epfd, p.raw, 0)
	if errors.Is(p.err, unix.EINTR) {
		p.n, p.err = 0, nil
	}
	return p.n != 0 || p.err != nil
}

const watchEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// Add starts watching fd for readability, reporting it once with tag, which
// must not be the largest uint64.
func (p *Poller) Add(fd int, tag uint64) error {
	ev := unix.EpollEvent{Events: watchEvents}
	setTag(&ev, tag)
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl add: %w", err)
	}
	return nil
}

// Resume reports fd once more when it is readable, after its reader is
// done with what the last report announced.
func (p *Poller) Resume(fd int, tag uint64) error {
	ev := unix.EpollEvent{Events: watchEvents}
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

// Wait blocks until at least one descriptor is readable or msec
// milliseconds pass (-1 waits forever), and appends the events to dst.
func (p *Poller) Wait(dst []Event, msec int) ([]Event, error) {
	if msec >= 0 || p.deadline {
		var deadline time.Time
		if msec >= 0 {
			deadline = time.Now().Add(time.Duration(msec) * time.Millisecond)
		}
		if err := p.file.SetReadDeadline(deadline); err != nil {
			return dst, fmt.Errorf("epoll deadline: %w", err)
		}
		p.deadline = msec >= 0
	}
	for {
		if p.closed.Load() {
			return dst, ErrClosed
		}
		err := p.rc.Read(p.poll)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return dst, nil
		case err != nil:
			return dst, fmt.Errorf("wait for the epoll descriptor: %w", err)
		case p.err != nil:
			return dst, fmt.Errorf("epoll_wait: %w", p.err)
		}
		for _, ev := range p.raw[:p.n] {
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
	return errors.Join(p.file.Close(), unix.Close(p.wakefd))
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
