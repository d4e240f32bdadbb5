package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/internal/netpoll"
)

// stalled has the backlog of c's socket written once the socket can take
// it: c's socket just left part of a frame for the kernel to take later
// (socket.Conn), and c's changes wait in its box meanwhile, where they
// coalesce, instead of piling up behind it; nor is the socket read
// meanwhile, once what was read of it is handled (readAndResume), so that
// the answers to what its peer sends do not pile up either. The writable
// poller reports the socket when its peer has read (writePollLoop);
// closeStalled closes it if it takes nothing for WriteTimeout. No
// goroutine waits for a slow peer. The caller holds c's socket's write
// lock.
func (sk *sockets) stalled(c *conn) {
	c.box.Hold()
	sk.metrics.stalls.Inc()
	sk.stalls.add(c)
	if c.closed.Load() {
		// end may have looked at the set before the add: it leaves
		// nothing behind either way.
		sk.stalls.remove(c)
		return
	}
	if sk.wpoller == nil {
		return // a socket that can stall has a descriptor: never here
	}
	sk.awaitWritable(c)
}

// awaitWritable has the writable poller report c's socket once.
func (sk *sockets) awaitWritable(c *conn) {
	c.pollMu.Lock()
	var err error
	if fd, ok := c.sock.Fd(); ok && !c.closed.Load() {
		c.fd = int32(fd)
		if c.wpolled {
			err = sk.wpoller.Resume(fd, c.tag)
		} else if err = sk.wpoller.Add(fd, c.tag); err == nil {
			c.wpolled = true
		}
	}
	c.pollMu.Unlock()
	if err != nil {
		sk.log.Error("poll socket for writing", "conn_id", c.connID, "err", err)
		sk.end(c, endClean, 0, "socket unusable")
	}
}

// writePollLoop writes the backlogs of the sockets the writable poller
// reports, until the poller is closed (see Serve).
func (sk *sockets) writePollLoop(context.Context) {
	events := make([]netpoll.Event, 0, 256)
	for {
		var err error
		events, err = sk.wpoller.Wait(events[:0], -1)
		if err != nil {
			if !errors.Is(err, netpoll.ErrClosed) {
				sk.log.Error("poll for writing", "err", err)
			}
			return
		}
		for _, ev := range events {
			if c := sk.registry.get(ev.Tag); c != nil {
				sk.drain(c)
			}
		}
	}
}

// drain writes what c's socket takes of its backlog; once all of it
// is written, c's changes are written again as they come.
func (sk *sockets) drain(c *conn) {
	c.sock.Lock()
	done, err := c.sock.Drain()
	if done {
		// Under the lock: a write that stalls the socket again right
		// after it must find it out of the set, and put it back.
		sk.stalls.remove(c)
	}
	c.sock.Unlock()
	switch {
	case err != nil:
		c.writeFailed(err)
	case done:
		sk.resumeReading(c)
		c.release()
	default:
		sk.awaitWritable(c)
	}
}

// resumeReading has the poller report c's socket again when its reading
// was paused while it was stalled (see readAndResume).
func (sk *sockets) resumeReading(c *conn) {
	c.pollMu.Lock()
	var err error
	if c.rpaused && !c.closed.Load() {
		c.rpaused = false
		// Its peer has just read all it was sent: it is alive, and its
		// own frames wait to be read. The TTL counts from now, so that
		// it is not ended as silent in the moment before they are.
		c.lastFrame.Store(nowNano())
		err = sk.poller.Resume(int(c.fd), c.tag)
	}
	c.pollMu.Unlock()
	if err != nil {
		sk.end(c, endClean, 0, "socket unusable")
	}
}

// closeStalled closes, as too slow, the sockets that took nothing of
// their backlogs for WriteTimeout, looking a tenth of it apart (50 ms to
// 1 s), until ctx is canceled.
func (sk *sockets) closeStalled(ctx context.Context) {
	t := time.NewTicker(min(max(sk.cfg.WriteTimeout/10, 50*time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, c := range sk.stalls.since(now.UnixNano() - int64(sk.cfg.WriteTimeout)) {
				c.writeFailed(socket.ErrStalled)
			}
		}
	}
}

// stallSet holds the connections whose sockets stalled, until their
// backlogs are written or they end: few, where a sweep of every
// connection would touch every socket. It is safe for concurrent use.
type stallSet struct {
	mu    sync.Mutex
	conns map[*conn]struct{}
}

func (st *stallSet) add(c *conn) {
	st.mu.Lock()
	if st.conns == nil {
		st.conns = make(map[*conn]struct{})
	}
	st.conns[c] = struct{}{}
	st.mu.Unlock()
}

func (st *stallSet) remove(c *conn) {
	st.mu.Lock()
	delete(st.conns, c)
	st.mu.Unlock()
}

func (st *stallSet) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.conns)
}

// since returns the connections whose sockets have taken nothing since
// before t (unix ns).
func (st *stallSet) since(t int64) []*conn {
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []*conn
	for c := range st.conns {
		if at := c.sock.Stalled(); at != 0 && at < t {
			out = append(out, c)
		}
	}
	return out
}
