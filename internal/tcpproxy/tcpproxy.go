// Package tcpproxy is a TCP proxy on loopback for greendot's tests, to put
// a network path between two real parts and make it fail.
//
// A Proxy passes every connection it accepts to its target, which the test
// can change while it runs. Each connection and the one dialed for it are a
// Link. The test can cut every live link at once (Cut, Reset), hold one as a
// path that died (Hold), and filter what each direction of a link passes
// (Filters): drop, change or note it. The proxy is closed, with every link,
// when the test ends.
package tcpproxy

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy passes TCP connections from a loopback port to a target.
type Proxy struct {
	ln      net.Listener
	filters Filters
	ctx     context.Context // ended when the proxy closes, with the dials under way
	stop    context.CancelFunc
	wg      sync.WaitGroup

	mu     sync.Mutex
	target string
	cuts   int // how many cuts there were: a link accepted before one is not made
	links  map[*Link]struct{}
}

// A Filter is given each chunk one direction of a link reads, and returns
// what to write on: the chunk, a part or a change of it, or nothing to drop
// it. Each direction calls its own Filter, from one goroutine; a Filter
// must not block. It may hold its link: what it returns is still written.
type Filter func(b []byte) []byte

// Filters is called for each link before anything passes, and returns the
// filters of its two directions: what the client sends to the target, and
// what comes back. A nil Filter passes everything.
type Filters func(l *Link) (toTarget, fromTarget Filter)

// Link is one connection through the proxy: the client's, and the one the
// proxy dialed to the target for it.
type Link struct {
	client, server net.Conn
	held           atomic.Bool
	once           sync.Once
	closed         chan struct{}
}

// Start listens on a loopback port and passes every connection to target,
// through the filters filters returns for it; filters may be nil. The proxy
// is closed when tb ends.
func Start(tb testing.TB, target string, filters Filters) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, filters: filters, target: target, links: make(map[*Link]struct{})}
	p.ctx, p.stop = context.WithCancel(context.Background())
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		_ = ln.Close()
		p.stop()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget sends the connections accepted from now on to target; the links
// open stay as they are. With an empty target the proxy refuses
// connections: it closes each as it accepts it.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Links returns the links open now.
func (p *Proxy) Links() []*Link {
	p.mu.Lock()
	defer p.mu.Unlock()
	links := make([]*Link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	return links
}

// Cut closes every link open now, and those accepted but still dialing,
// and returns how many were open.
func (p *Proxy) Cut() int { return p.cut(false) }

// Reset is Cut with a reset (RST) instead of a close (FIN) on both sides of
// every link, as a middlebox that died would.
func (p *Proxy) Reset() int { return p.cut(true) }

func (p *Proxy) cut(reset bool) int {
	p.mu.Lock()
	links := p.links
	p.links = make(map[*Link]struct{})
	p.cuts++
	p.mu.Unlock()
	for l := range links {
		l.close(reset)
	}
	return len(links)
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target, cuts := p.target, p.cuts
		p.mu.Unlock()
		if target == "" {
			_ = c.Close()
			continue
		}
		p.wg.Go(func() { p.serve(c, target, cuts) })
	}
}

// serve dials target for the client c, accepted when there had been cuts
// cuts, and passes the link's bytes until it ends.
func (p *Proxy) serve(c net.Conn, target string, cuts int) {
	var d net.Dialer
	s, err := d.DialContext(p.ctx, "tcp", target)
	if err != nil {
		_ = c.Close()
		return
	}
	l := &Link{client: c, server: s, closed: make(chan struct{})}
	p.mu.Lock()
	if p.cuts != cuts {
		p.mu.Unlock()
		l.close(false)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	var toTarget, fromTarget Filter
	if p.filters != nil {
		toTarget, fromTarget = p.filters(l)
	}
	var pipes sync.WaitGroup
	pipes.Go(func() { p.pipe(l, s, c, toTarget) })
	p.pipe(l, c, s, fromTarget)
	pipes.Wait()
}

// pipe copies src to dst through f, and closes the link when src ends or
// dst fails. On a held link it drops what it read and waits, closing
// nothing, until the link is cut.
func (p *Proxy) pipe(l *Link, dst, src net.Conn, f Filter) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if l.held.Load() {
			break
		}
		b := buf[:n]
		if f != nil && n > 0 {
			b = f(b)
		}
		if len(b) > 0 {
			if _, err := dst.Write(b); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	if l.held.Load() {
		<-l.closed
		return
	}
	l.close(false)
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// Hold makes the link a path that died: from now on it passes nothing
// either way, soon reads no more of either side, and closes neither when
// the other ends, until it is cut.
func (l *Link) Hold() {
	l.held.Store(true)
	past := time.Unix(1, 0) // wakes the reads under way
	_ = l.client.SetReadDeadline(past)
	_ = l.server.SetReadDeadline(past)
}

// close closes both sides of the link, with a reset if reset is set.
func (l *Link) close(reset bool) {
	l.once.Do(func() {
		for _, c := range []net.Conn{l.client, l.server} {
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
		close(l.closed)
	})
}
