package gateway

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/internal/netpoll"
)

// readSize is the size of a read buffer: room for a whole message of the
// largest size, and no more, as every reader keeps its buffer (a frame
// that does not fit is read over several wake-ups; the decoder keeps its
// start).
func (s *Service) readSize() int { return max(4<<10, s.cfg.MaxMessageSize+ws.MaxHeaderSize) }

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
		c.fd = int32(fd)
		if err = s.poller.Add(int(c.fd), c.tag); err == nil {
			c.polled = true
		}
	}
	c.pollMu.Unlock()
	if err != nil {
		s.log.Error("poll socket", "conn_id", c.connID, "err", err)
		s.end(c, endClean, ws.StatusInternalServerError, "internal error")
	}
}

// readBatchSize is how many readable sockets one reader is handed at
// once, from one wake-up of the poller: heartbeats come in bursts, and a
// reader per socket of a burst would keep dozens of readers (and their
// buffers) busy for what one reads in a few microseconds each.
const readBatchSize = 8

// readBatch is the sockets one reader reads in a row.
type readBatch struct {
	n  int
	cs [readBatchSize]*conn
}

// pollLoop waits for readable sockets and has a reader (workerPool) read
// them, in batches, until the poller is closed (see Serve). It returns
// when every reader has.
func (s *Service) pollLoop(context.Context) {
	readers := newWorkerPool(s.cfg.ReadWorkers, func() *socket.ReadBuffer { return socket.NewReadBuffer(s.readSize()) }, s.readSockets)
	defer readers.stop()
	var sweeper sync.WaitGroup
	done := make(chan struct{})
	defer sweeper.Wait()
	defer close(done)
	sweeper.Go(func() {
		t := time.NewTicker(workerIdle)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				readers.sweep(now)
			}
		}
	})
	events := make([]netpoll.Event, 0, 256)
	for {
		var err error
		events, err = s.poller.Wait(events[:0], -1)
		if err != nil {
			if !errors.Is(err, netpoll.ErrClosed) {
				s.log.Error("poll", "err", err)
			}
			return
		}
		var b readBatch
		for _, ev := range events {
			if b.cs[b.n] = s.registry.get(ev.Tag); b.cs[b.n] == nil {
				continue
			}
			if b.n++; b.n == readBatchSize {
				readers.run(b)
				b = readBatch{}
			}
		}
		if b.n > 0 {
			readers.run(b)
		}
		// The readers just handed work wait on this goroutine's P, and
		// Wait is a system call that blocks with the P held. Left there,
		// they wait until the runtime's monitor takes the P back, which
		// makes another thread start and the monitor poll again every
		// 20 microseconds: at 20,000 connections and 1,000 changes a
		// second that was over a third of the gateways' context
		// switches. Yielding first lets the readers run here and the
		// next Wait start with nothing queued behind it.
		runtime.Gosched()
	}
}

// readSockets reads the sockets of b, one after the other, with rb.
func (s *Service) readSockets(b readBatch, rb *socket.ReadBuffer) {
	for _, c := range b.cs[:b.n] {
		s.readAndResume(c, rb)
	}
}

// readAndResume reads a readable socket and, if its connection is still
// open, gives it back to the poller; but not while the socket is stalled
// (see stalled): a peer that does not read what it is sent is not read
// either until it has, so that the answers to what it sends do not pile
// up in its backlog.
func (s *Service) readAndResume(c *conn, rb *socket.ReadBuffer) {
	if !s.readEnded(c, c.sock.ReadReady(rb, s.cfg.MaxMessageSize, c)) {
		return
	}
	c.pollMu.Lock()
	var err error
	switch {
	case c.closed.Load():
	case c.sock.Stalled() != 0:
		c.rpaused = true // drainSocket resumes it
	default:
		err = s.poller.Resume(int(c.fd), c.tag)
	}
	c.pollMu.Unlock()
	if err != nil {
		s.end(c, endClean, 0, "socket unusable")
	}
}

// readLoop reads c with a goroutine of its own, where there is no poller.
func (s *Service) readLoop(c *conn) {
	s.readEnded(c, c.sock.ReadLoop(make([]byte, s.readSize()), s.cfg.MaxMessageSize, c))
}

// readEnded ends c as a read's error says, and reports whether c is still
// open.
func (s *Service) readEnded(c *conn, err error) bool {
	if err == nil {
		return c.open()
	}
	s.readFailed(c, err)
	return false
}

// readFailed ends c as a failed read's error says. (Apart from readEnded,
// so that the open connection's path allocates nothing.)
func (s *Service) readFailed(c *conn, err error) {
	var fe *socket.FrameError
	switch {
	case errors.As(err, &fe):
		s.end(c, endClean, fe.Code, fe.Reason)
	case errors.Is(err, io.EOF):
		// The client is gone without a close frame.
		s.end(c, endClean, 0, "connection lost")
	default:
		s.end(c, endClean, 0, "socket closed")
	}
}
