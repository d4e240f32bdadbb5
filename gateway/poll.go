package gateway

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/gobwas/ws"
	"golang.org/x/sys/unix"

	"github.com/greendot/greendot/gateway/internal/netpoll"
)

// readPool holds read buffers; a buffer is held only while a socket is
// being read.
var readPool sync.Pool

func (s *Service) readBuf() *[]byte {
	if b, ok := readPool.Get().(*[]byte); ok && len(*b) >= s.readSize() {
		return b
	}
	b := make([]byte, s.readSize())
	return &b
}

// readSize is the size of a read buffer: room for a few whole messages.
func (s *Service) readSize() int { return max(16<<10, 2*(s.cfg.MaxMessageSize+ws.MaxHeaderSize)) }

// watchSocket starts reading c: through the poller, or with a goroutine of
// its own where there is no poller.
func (s *Service) watchSocket(c *conn) {
	if s.poller == nil || c.raw == nil {
		go s.readLoop(c)
		return
	}
	c.pollMu.Lock()
	defer c.pollMu.Unlock()
	if c.closed.Load() {
		return
	}
	err := c.raw.Control(func(fd uintptr) { c.fd = int(fd) })
	if err == nil {
		err = s.poller.Add(c.fd, c.tag)
	}
	if err != nil {
		s.log.Error("poll socket", "conn_id", c.connID, "err", err)
		go c.end(endClean, ws.StatusInternalServerError, "internal error")
		return
	}
	c.polled = true
}

// pollLoop waits for readable sockets and reads each on a goroutine of its
// own, at most ReadWorkers at once, until ctx is canceled. It returns when
// every reader has.
func (s *Service) pollLoop(ctx context.Context) {
	events := make([]netpoll.Event, 0, 256)
	stop := make(chan struct{})
	go func() {
		<-ctx.Done()
		_ = s.poller.Close()
		close(stop)
	}()
	var readers sync.WaitGroup
	defer readers.Wait()
	for {
		var err error
		events, err = s.poller.Wait(events[:0], -1)
		if err != nil {
			if !errors.Is(err, netpoll.ErrClosed) {
				s.log.Error("poll", "err", err)
			}
			<-stop
			return
		}
		for _, ev := range events {
			c := s.registry.get(ev.Tag)
			if c == nil {
				continue
			}
			s.readSem <- struct{}{}
			readers.Go(func() {
				defer func() { <-s.readSem }()
				if s.readReady(c) {
					c.pollMu.Lock()
					if !c.closed.Load() {
						if err := s.poller.Resume(c.fd, c.tag); err != nil {
							go c.end(endClean, 0, "socket unusable")
						}
					}
					c.pollMu.Unlock()
				}
			})
		}
	}
}

// readReady reads what a readable socket holds, without blocking, and
// handles it. It reports whether the connection is still open.
func (s *Service) readReady(c *conn) bool {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	bp := s.readBuf()
	defer readPool.Put(bp)
	buf := *bp
	var (
		n    int
		rerr error
	)
	err := c.raw.Read(func(fd uintptr) bool {
		n, rerr = unix.Read(int(fd), buf)
		return true
	})
	switch {
	case err != nil:
		c.end(endClean, 0, "socket closed")
		return false
	case rerr == unix.EAGAIN || rerr == unix.EINTR:
		return c.open()
	case rerr != nil || n == 0:
		// EOF or a reset: the client is gone without a close frame.
		c.end(endClean, 0, "connection lost")
		return false
	}
	return c.consume(buf[:n])
}

// consume decodes bytes read from the socket and handles them.
func (c *conn) consume(data []byte) bool {
	if err := c.dec.decode(data, c.s.cfg.MaxMessageSize, c); err != nil {
		var fe *errFrame
		if errors.As(err, &fe) {
			c.end(endClean, fe.code, fe.reason)
		} else {
			c.end(endClean, ws.StatusProtocolError, err.Error())
		}
		return false
	}
	return c.open()
}

// readLoop reads c with a goroutine of its own, where there is no poller.
func (s *Service) readLoop(c *conn) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	bp := s.readBuf()
	defer readPool.Put(bp)
	for {
		n, err := c.nc.Read(*bp)
		if n > 0 && !c.consume((*bp)[:n]) {
			return
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !isClosedErr(err) {
				s.log.Debug("read", "conn_id", c.connID, "err", err)
			}
			c.end(endClean, 0, "connection lost")
			return
		}
	}
}
