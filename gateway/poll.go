package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/internal/netpoll"
)

// sockets is the part of the gateway that reads its connections' sockets
// and writes the backlogs of those that stalled: the readable poller and
// the readers it hands sockets to (or a goroutine per socket, where there
// is no poller), the writable poller, and the stalled sockets (see
// stalled). It is safe for concurrent use.
type sockets struct {
	cfg      Config
	log      *slog.Logger
	metrics  *gatewayMetrics
	registry *registry
	// end ends a connection (Service.end), which has forget take it out
	// of the pollers and the stalled set.
	end func(c *conn, kind endKind, code ws.StatusCode, reason string)

	// The pollers, made by open where the system has them; nil
	// elsewhere. wpoller reports stalled sockets once they can take
	// more, and stalls holds them meanwhile.
	poller, wpoller *netpoll.Poller
	stalls          stallSet
	// readLoops are the sockets' reading goroutines where there is no
	// poller.
	readLoops sync.WaitGroup
}

// open makes the pollers, where the system has them.
func (sk *sockets) open() error {
	if !netpoll.Supported {
		return nil
	}
	poller, err := netpoll.New()
	if err != nil {
		return err
	}
	wpoller, err := netpoll.NewWritable()
	if err != nil {
		_ = poller.Release()
		return err
	}
	sk.poller, sk.wpoller = poller, wpoller
	return nil
}

// polled reports whether the pollers read the sockets (open made them).
func (sk *sockets) polled() bool { return sk.poller != nil }

// run starts the pollers' loops in g, where there are pollers; stopping g
// closes the pollers, which ends them.
func (sk *sockets) run(g *group) {
	if !sk.polled() {
		return
	}
	g.Go(sk.pollLoop)
	g.Go(sk.writePollLoop)
	g.Go(sk.closeStalled)
	g.Go(func(ctx context.Context) {
		<-ctx.Done()
		_ = sk.poller.Close()  // wakes pollLoop
		_ = sk.wpoller.Close() // wakes writePollLoop
	})
}

// wait waits for the reading goroutines where there is no poller; the
// caller has closed every connection.
func (sk *sockets) wait() { sk.readLoops.Wait() }

// release releases the pollers, once their loops have returned.
func (sk *sockets) release() {
	if sk.polled() {
		_ = sk.poller.Release()
		_ = sk.wpoller.Release()
	}
}

// forget takes c's socket out of the pollers and the stalled set: c has
// ended.
func (sk *sockets) forget(c *conn) {
	c.pollMu.Lock()
	if c.polled {
		_ = sk.poller.Remove(int(c.fd))
		c.polled = false
	}
	if c.wpolled {
		_ = sk.wpoller.Remove(int(c.fd))
		c.wpolled = false
	}
	c.pollMu.Unlock()
	sk.stalls.remove(c)
}

// readSize is the size of a read buffer: room for a whole message of the
// largest size, and no more, as every reader keeps its buffer (a frame
// that does not fit is read over several wake-ups; the decoder keeps its
// start).
func (sk *sockets) readSize() int { return max(4<<10, sk.cfg.MaxMessageSize+ws.MaxHeaderSize) }

// watch starts reading c: through the poller, or with a goroutine of
// its own where there is none (Serve waits for those after closing every
// connection).
func (sk *sockets) watch(c *conn) {
	fd, ok := c.sock.Fd()
	if sk.poller == nil || !ok {
		sk.readLoops.Go(func() { sk.readLoop(c) })
		return
	}
	c.pollMu.Lock()
	var err error
	if !c.closed.Load() {
		c.fd = int32(fd)
		if err = sk.poller.Add(int(c.fd), c.tag); err == nil {
			c.polled = true
		}
	}
	c.pollMu.Unlock()
	if err != nil {
		sk.log.Error("poll socket", "conn_id", c.connID, "err", err)
		sk.end(c, endClean, ws.StatusInternalServerError, "internal error")
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
func (sk *sockets) pollLoop(context.Context) {
	readers := newWorkerPool(sk.cfg.ReadWorkers, func() *socket.ReadBuffer { return socket.NewReadBuffer(sk.readSize()) }, sk.readSockets)
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
		events, err = sk.poller.Wait(events[:0], -1)
		if err != nil {
			if !errors.Is(err, netpoll.ErrClosed) {
				sk.log.Error("poll", "err", err)
			}
			return
		}
		var b readBatch
		for _, ev := range events {
			if b.cs[b.n] = sk.registry.get(ev.Tag); b.cs[b.n] == nil {
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
func (sk *sockets) readSockets(b readBatch, rb *socket.ReadBuffer) {
	for _, c := range b.cs[:b.n] {
		sk.readAndResume(c, rb)
	}
}

// readAndResume reads a readable socket and, if its connection is still
// open, gives it back to the poller; but not while the socket is stalled
// (see stalled): a peer that does not read what it is sent is not read
// either until it has, so that the answers to what it sends do not pile
// up in its backlog.
func (sk *sockets) readAndResume(c *conn, rb *socket.ReadBuffer) {
	if !sk.readEnded(c, c.sock.ReadReady(rb, sk.cfg.MaxMessageSize, c)) {
		return
	}
	c.pollMu.Lock()
	var err error
	switch {
	case c.closed.Load():
	case c.sock.Stalled() != 0:
		c.rpaused = true // drain resumes it
	default:
		err = sk.poller.Resume(int(c.fd), c.tag)
	}
	c.pollMu.Unlock()
	if err != nil {
		sk.end(c, endClean, 0, "socket unusable")
	}
}

// readLoop reads c with a goroutine of its own, where there is no poller.
func (sk *sockets) readLoop(c *conn) {
	sk.readEnded(c, c.sock.ReadLoop(make([]byte, sk.readSize()), sk.cfg.MaxMessageSize, c))
}

// readEnded ends c as a read's error says, and reports whether c is still
// open.
func (sk *sockets) readEnded(c *conn, err error) bool {
	if err == nil {
		return c.open()
	}
	sk.readFailed(c, err)
	return false
}

// readFailed ends c as a failed read's error says. (Apart from readEnded,
// so that the open connection's path allocates nothing.)
func (sk *sockets) readFailed(c *conn, err error) {
	var fe *socket.FrameError
	switch {
	case errors.As(err, &fe):
		sk.end(c, endClean, fe.Code, fe.Reason)
	case errors.Is(err, io.EOF):
		// The client is gone without a close frame.
		sk.end(c, endClean, 0, "connection lost")
	default:
		sk.end(c, endClean, 0, "socket closed")
	}
}
