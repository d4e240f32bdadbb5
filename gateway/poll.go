package gateway

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/internal/netpoll"
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
// its own where there is none (Serve waits for those after closing every
// connection).
func (s *Service) watchSocket(c *conn) {
	fd, ok := c.sock.Fd()
	if s.poller == nil || !ok {
		s.readLoops.Go(func() { s.readLoop(c) })
		return
	}
	c.pollMu.Lock()
	var err error
	if !c.closed.Load() {
		c.fd = fd
		if err = s.poller.Add(c.fd, c.tag); err == nil {
			c.polled = true
		}
	}
	c.pollMu.Unlock()
	if err != nil {
		s.log.Error("poll socket", "conn_id", c.connID, "err", err)
		s.end(c, endClean, ws.StatusInternalServerError, "internal error")
	}
}

// pollLoop waits for readable sockets and reads each on a goroutine of its
// own, at most ReadWorkers at once, until the poller is closed (see Serve).
// It returns when every reader has.
func (s *Service) pollLoop(context.Context) {
	events := make([]netpoll.Event, 0, 256)
	var readers sync.WaitGroup
	defer readers.Wait()
	for {
		var err error
		events, err = s.poller.Wait(events[:0], -1)
		if err != nil {
			if !errors.Is(err, netpoll.ErrClosed) {
				s.log.Error("poll", "err", err)
			}
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
				if !s.readReady(c) {
					return
				}
				c.pollMu.Lock()
				var err error
				if !c.closed.Load() {
					err = s.poller.Resume(c.fd, c.tag)
				}
				c.pollMu.Unlock()
				if err != nil {
					s.end(c, endClean, 0, "socket unusable")
				}
			})
		}
	}
}

// readReady reads what a readable socket holds, without blocking, and
// handles it. It reports whether the connection is still open.
func (s *Service) readReady(c *conn) bool {
	bp := s.readBuf()
	defer readPool.Put(bp)
	return s.readEnded(c, c.sock.ReadReady(*bp, s.cfg.MaxMessageSize, c))
}

// readLoop reads c with a goroutine of its own, where there is no poller.
func (s *Service) readLoop(c *conn) {
	bp := s.readBuf()
	defer readPool.Put(bp)
	s.readEnded(c, c.sock.ReadLoop(*bp, s.cfg.MaxMessageSize, c))
}

// readEnded ends c as a read's error says, and reports whether c is still
// open.
func (s *Service) readEnded(c *conn, err error) bool {
	var fe *socket.FrameError
	switch {
	case err == nil:
		return c.open()
	case errors.As(err, &fe):
		s.end(c, endClean, fe.Code, fe.Reason)
	case errors.Is(err, io.EOF):
		// The client is gone without a close frame.
		s.end(c, endClean, 0, "connection lost")
	default:
		s.end(c, endClean, 0, "socket closed")
	}
	return false
}
