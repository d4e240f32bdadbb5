package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/internal/netpoll"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
)

// A worker holds its sockets as the gateway does: where netpoll is
// supported, each socket is taken out of the Go runtime's poller
// (netpoll.Detach) and watched by one epoll instance of the worker, and a
// readable socket is read by one of a few goroutines with a pooled buffer
// until a read would block, then handed back to the poller. An idle socket
// has no goroutine and no buffer; only the start of an incomplete frame is
// kept between reads. Elsewhere, or when a socket has no descriptor (TLS),
// a goroutine per socket reads it with client.Conn.Read.

// noPollSockets turns the poller off: tests run the goroutine per socket
// with it.
var noPollSockets atomic.Bool

const (
	// readBufSize is the size of a pooled read buffer.
	readBufSize = 32 << 10
	// readsPerWake bounds the reads of one socket before it is handed
	// back to the poller, so that a busy socket does not hold a reader.
	readsPerWake = 8
)

// readWorkers is how many goroutines read readable sockets (each holds a
// buffer while it reads). Too few, and a socket waits behind a
// burst of others: a room_diff sent to thousands of members delayed a large
// room_state arriving in several reads.
const readWorkers = 64

var readBufs = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}

// poller is a worker's epoll instance, its loop and the sockets it holds.
type poller struct {
	w  *worker
	np *netpoll.Poller
	// ready hands readable sockets to the readers.
	ready chan *live
	loop  sync.WaitGroup

	mu    sync.Mutex
	lives map[uint64]*live // by tag
	next  uint64
}

// polled is the state of a socket read through a poller.
type polled struct {
	p   *poller // nil when the socket has a goroutine of its own
	v   *vconn
	fd  int
	tag uint64

	// pmu guards the state below. reading: a goroutine is reading the
	// socket, or it is being set up (not in the poller then); closing:
	// the worker closed it meanwhile; ended: it is done, or being done,
	// with; armed: it was added to the poller once. A goroutine that
	// takes a socket to read sets reading under pmu, and the one that
	// hands it back clears it: so each reader sees the decoder as the
	// previous one left it.
	pmu                            sync.Mutex
	reading, closing, ended, armed bool
	dec                            frameDecoder
}

// pollerFor returns the worker's poller, started on first use; nil when
// sockets are not to be read through one.
func (w *worker) pollerFor() *poller {
	if !netpoll.Supported || noPollSockets.Load() {
		return nil
	}
	w.pollMu.Lock()
	defer w.pollMu.Unlock()
	if w.poll == nil && !w.noPoll {
		np, err := netpoll.New()
		if err != nil {
			w.noPoll = true
			w.errs.add("no poller, a goroutine reads each socket: %v", err)
			return nil
		}
		p := &poller{w: w, np: np, ready: make(chan *live), lives: make(map[uint64]*live)}
		p.loop.Go(p.run)
		w.poll = p
	}
	return w.poll
}

// stopPoller ends the poller's loop; every socket it held has ended.
func (w *worker) stopPoller() {
	w.pollMu.Lock()
	p := w.poll
	w.poll = nil
	w.pollMu.Unlock()
	if p == nil {
		return
	}
	_ = p.np.Close()
	p.loop.Wait()
	_ = p.np.Release()
}

// takeSocket takes c's socket out of the runtime's poller and its reading
// out of c, for p; false (c unchanged) when c's socket has no descriptor.
// It returns the bytes c read past its hello frame.
func (p *poller) takeSocket(l *live, v *vconn) ([]byte, bool) {
	rest, err := l.c.TakeReading(netpoll.Detach)
	if err != nil {
		return nil, false
	}
	l.p, l.v, l.fd, l.reading = p, v, -1, true
	l.dec.deflate = l.c.Compressed()
	if sc, ok := l.c.NetConn().(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			_ = raw.Control(func(fd uintptr) { l.fd = int(fd) })
		}
	}
	return rest, true
}

// start handles what l's connection read past its hello frame, then
// hands the socket to the poller. l is reading: an abort meanwhile leaves
// it to start to end it.
func (p *poller) start(l *live, rest []byte) {
	p.mu.Lock()
	p.next++
	l.tag = p.next
	p.lives[l.tag] = l
	p.mu.Unlock()
	var err error
	if len(rest) > 0 {
		err = l.dec.decode(rest, l)
	}
	p.done(l, err)
}

// run waits for readable sockets and hands each to one of readWorkers
// goroutines, until the poller is closed. It returns when every reader has.
// The readers last as long as the poller, so that their stacks, grown by
// decoding, are not grown again for every socket read.
func (p *poller) run() {
	var readers sync.WaitGroup
	for range readWorkers {
		readers.Go(func() {
			for l := range p.ready {
				p.done(l, p.read(l))
			}
		})
	}
	defer readers.Wait()
	defer close(p.ready)
	events := make([]netpoll.Event, 0, 256)
	for {
		var err error
		events, err = p.np.Wait(events[:0], -1)
		if err != nil {
			if !errors.Is(err, netpoll.ErrClosed) {
				p.w.errs.add("poll: %v", err)
			}
			return
		}
		for _, ev := range events {
			p.mu.Lock()
			l := p.lives[ev.Tag]
			p.mu.Unlock()
			if l == nil {
				continue
			}
			l.pmu.Lock()
			if l.ended || l.reading {
				l.pmu.Unlock()
				continue
			}
			l.reading = true
			l.pmu.Unlock()
			p.ready <- l
		}
		// As the gateway's poller does: the readers just woken run on
		// this goroutine's P before the next epoll_wait blocks holding it.
		runtime.Gosched()
	}
}

// read reads what l's socket holds, without blocking, and handles each
// frame in order. It returns nil while the connection stays open.
func (p *poller) read(l *live) error {
	sc, ok := l.c.NetConn().(syscall.Conn)
	if !ok {
		return net.ErrClosed
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	for range readsPerWake {
		var (
			n    int
			rerr error
		)
		if err := raw.Read(func(fd uintptr) bool {
			n, rerr = netpoll.ReadNow(int(fd), buf)
			return true
		}); err != nil {
			return err
		}
		switch {
		case rerr == io.EOF:
			return l.dec.end()
		case rerr != nil:
			return rerr
		case n == 0:
			return nil // it would block: back to the poller
		}
		if err := l.dec.decode(buf[:n], l); err != nil {
			return err
		}
		if n < len(buf) {
			return nil
		}
	}
	return nil
}

// done ends a read of l: it hands the socket back to the poller, or ends
// the connection when err says it ended or the worker closed it.
func (p *poller) done(l *live, err error) {
	l.pmu.Lock()
	if err == nil && l.closing {
		err = net.ErrClosed
	}
	if err == nil {
		if l.armed {
			err = p.np.Resume(l.fd, l.tag)
		} else if err = p.np.Add(l.fd, l.tag); err == nil {
			l.armed = true
		}
		if err != nil {
			err = fmt.Errorf("poll socket: %w", err)
		}
	}
	if err != nil {
		l.ended = true
		l.pmu.Unlock()
		p.end(l, err)
		return
	}
	l.reading = false
	l.pmu.Unlock()
}

// end ends l, once: as a goroutine reading it would on err.
func (p *poller) end(l *live, err error) {
	p.mu.Lock()
	delete(p.lives, l.tag)
	p.mu.Unlock()
	l.dec = frameDecoder{}
	p.w.lost(l.v, l, err)
	_ = l.c.Abort()
	close(l.done)
	p.w.readers.Done()
}

// abort closes l's socket, with a reset when hard; its reader, or this
// call when it is in the poller, ends it through lost.
func (l *live) abort(hard bool) {
	if hard {
		setLingerZero(l.c.NetConn())
	}
	if l.p == nil {
		_ = l.c.Abort()
		return
	}
	l.pmu.Lock()
	if l.ended || l.reading {
		l.closing = true
		l.pmu.Unlock()
		_ = l.c.Abort()
		return
	}
	l.ended = true
	l.pmu.Unlock()
	l.p.end(l, net.ErrClosed)
}

// frame handles a frame of l's socket read through the poller.
func (l *live) frame(op ws.OpCode, payload []byte) error {
	return l.p.w.frame(l.v, l, op, payload)
}

// frame handles a message or control frame of v's connection l read
// through the poller, as client.Conn.Read does: a message is decoded and
// handled with the time it was read, a ping answered, a close frame
// answered and returned as a *client.CloseError.
func (w *worker) frame(v *vconn, l *live, op ws.OpCode, payload []byte) error {
	switch op {
	case ws.OpText:
		var m protocol.ServerMessage
		if err := json.Unmarshal(payload, &m); err != nil {
			return fmt.Errorf("decode %q: %w", payload, err)
		}
		w.message(v, &m, time.Now().UnixNano())
		return nil
	case ws.OpPing:
		return l.c.SendRaw(ws.OpPong, payload)
	case ws.OpPong:
		return nil
	case ws.OpClose:
		return closeFrame(l.c, payload)
	}
	return fmt.Errorf("unexpected %v frame", op)
}

// closeFrame answers a close frame with payload, as the client's reader
// does (a failed answer does not hide the close), and returns the close.
func closeFrame(c *client.Conn, payload []byte) error {
	if len(payload) == 0 {
		_ = c.SendRaw(ws.OpClose, nil)
		return &client.CloseError{Code: ws.StatusNoStatusRcvd}
	}
	code, reason := ws.ParseCloseFrameData(payload)
	if err := ws.CheckCloseFrameData(code, reason); err != nil {
		_ = c.SendRaw(ws.OpClose, ws.NewCloseFrameBody(ws.StatusProtocolError, err.Error()))
		return err
	}
	_ = c.SendRaw(ws.OpClose, payload[:2])
	return &client.CloseError{Code: code, Reason: reason}
}
