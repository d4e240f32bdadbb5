package tcpproxy_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/tcpproxy"
)

// wait bounds every wait for bytes or a close that must come.
const wait = 10 * time.Second

// startTarget runs a TCP server on loopback that hands the test every
// connection it accepts, and closes them when the test ends.
func startTarget(t *testing.T) (addr string, conns <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan net.Conn, 16)
	var accepted []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted = append(accepted, c)
			ch <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for _, c := range accepted {
			_ = c.Close()
		}
	})
	return ln.Addr().String(), ch
}

// dial connects to the proxy at addr.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// next returns the next connection a target accepted.
func next(t *testing.T, conns <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-conns:
		return c
	case <-time.After(wait):
		t.Fatal("the target accepted no connection")
		return nil
	}
}

// send writes msg on from and checks that to reads want.
func send(t *testing.T, from, to net.Conn, msg, want string) {
	t.Helper()
	if _, err := from.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	_ = to.SetReadDeadline(time.Now().Add(wait))
	if _, err := io.ReadFull(to, got); err != nil || string(got) != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}

// readEnd reads c until it ends, and checks that it read nothing and ended
// with want.
func readEnd(t *testing.T, c net.Conn, want error) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	b, err := io.ReadAll(c)
	if want == io.EOF && err == nil {
		err = io.EOF // ReadAll reports the end as no error
	}
	if len(b) > 0 || !errors.Is(err, want) {
		t.Fatalf("read %q, then %v; want nothing, then %v", b, err, want)
	}
}

// ended checks that c reads nothing more and has ended, closed or reset:
// a side closed with bytes it did not read resets.
func ended(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	b, err := io.ReadAll(c)
	if len(b) > 0 || err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read %q, then %v; want nothing, then the end", b, err)
	}
}

// silent checks that c reads neither bytes nor an end for a while.
func silent(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	b := make([]byte, 16)
	if n, err := c.Read(b); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %q, %v; want nothing", b[:n], err)
	}
}

// TestPassesAndPoints: a link passes bytes both ways; SetTarget sends new
// connections to another target and leaves the open link where it is; an
// empty target refuses connections.
func TestPassesAndPoints(t *testing.T) {
	a, aConns := startTarget(t)
	b, bConns := startTarget(t)
	p := tcpproxy.Start(t, a, nil)

	c1 := dial(t, p.Addr())
	s1 := next(t, aConns)
	send(t, c1, s1, "ping", "ping")
	send(t, s1, c1, "pong", "pong")

	p.SetTarget(b)
	c2 := dial(t, p.Addr())
	s2 := next(t, bConns)
	send(t, c2, s2, "to b", "to b")
	send(t, c1, s1, "still a", "still a")

	p.SetTarget("")
	readEnd(t, dial(t, p.Addr()), io.EOF)
	if len(aConns)+len(bConns) != 0 {
		t.Fatal("a refused connection reached a target")
	}
	if n := len(p.Links()); n != 2 {
		t.Fatalf("%d links, want 2", n)
	}

	// A side that closes closes the link.
	_ = s1.Close()
	readEnd(t, c1, io.EOF)
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		if n := len(p.Links()); n != 1 {
			return errors.New("the closed link is still listed")
		}
		return nil
	})
}

// TestCut: Cut closes both sides of every open link and counts them, Reset
// resets them, and the proxy goes on accepting.
func TestCut(t *testing.T) {
	target, conns := startTarget(t)
	p := tcpproxy.Start(t, target, nil)
	c1 := dial(t, p.Addr())
	s1 := next(t, conns)
	c2 := dial(t, p.Addr())
	s2 := next(t, conns)
	send(t, c1, s1, "1", "1")
	send(t, c2, s2, "2", "2")

	if n := p.Cut(); n != 2 {
		t.Fatalf("Cut cut %d links, want 2", n)
	}
	for _, c := range []net.Conn{c1, s1, c2, s2} {
		readEnd(t, c, io.EOF)
	}

	c3 := dial(t, p.Addr())
	s3 := next(t, conns)
	send(t, c3, s3, "3", "3")
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset cut %d links, want 1", n)
	}
	readEnd(t, c3, syscall.ECONNRESET)
	readEnd(t, s3, syscall.ECONNRESET)
	if n := p.Cut(); n != 0 {
		t.Fatalf("Cut with no link open cut %d, want 0", n)
	}
}

// TestFilters: each direction of a link passes what its filter returns: a
// change of the chunk, or nothing.
func TestFilters(t *testing.T) {
	target, conns := startTarget(t)
	dropped := make(chan []byte, 1)
	made := make(chan *tcpproxy.Link, 1)
	p := tcpproxy.Start(t, target, func(l *tcpproxy.Link) (toTarget, fromTarget tcpproxy.Filter) {
		made <- l
		toTarget = bytes.ToUpper
		fromTarget = func(b []byte) []byte {
			if string(b) == "lost" {
				dropped <- bytes.Clone(b)
				return nil
			}
			return b
		}
		return toTarget, fromTarget
	})
	c := dial(t, p.Addr())
	s := next(t, conns)
	send(t, c, s, "ping", "PING")
	if l, links := <-made, p.Links(); len(links) != 1 || links[0] != l {
		t.Fatalf("links %v, want the one given to the filters, %p", links, l)
	}
	if _, err := s.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dropped:
	case <-time.After(wait):
		t.Fatal("the filter was not given what the target sent")
	}
	send(t, s, c, "pong", "pong") // nothing came before it
}

// TestHold: a held link passes nothing more either way, and does not close
// one side when the other closes, until it is cut.
func TestHold(t *testing.T) {
	target, conns := startTarget(t)
	p := tcpproxy.Start(t, target, nil)
	c := dial(t, p.Addr())
	s := next(t, conns)
	send(t, c, s, "ping", "ping")

	p.Links()[0].Hold()
	if _, err := c.Write([]byte("to target")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("to client")); err != nil {
		t.Fatal(err)
	}
	silent(t, c)
	_ = c.Close()
	silent(t, s)
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut cut %d links, want the held one", n)
	}
	ended(t, s)
}

// TestClosedWhenTestEnds: the proxy stops listening and closes every link,
// held or not, when its test ends.
func TestClosedWhenTestEnds(t *testing.T) {
	target, conns := startTarget(t)
	var addr string
	var clients, servers []net.Conn
	t.Run("proxy", func(t *testing.T) {
		p := tcpproxy.Start(t, target, nil)
		addr = p.Addr()
		for range 2 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
			servers = append(servers, next(t, conns))
		}
		send(t, clients[0], servers[0], "ping", "ping")
		send(t, clients[1], servers[1], "ping", "ping")
		p.Links()[0].Hold()
	})
	for i := range clients {
		ended(t, clients[i])
		ended(t, servers[i])
		_ = clients[i].Close()
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		_ = c.Close()
		t.Fatal("the proxy still accepts connections")
	}
}
