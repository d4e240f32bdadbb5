//go:build linux

package socket_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/internal/netpoll"
)

// detachedPair returns the transport of a socket held by its descriptor
// (as the gateway holds its sockets) and the peer's end.
func detachedPair(t *testing.T) (*socket.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = peer.Close() })
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	dc, err := netpoll.Detach(server)
	if err != nil {
		t.Fatal(err)
	}
	c := socket.New(dc, time.Minute)
	t.Cleanup(func() { c.Close(0, "", nil) })
	return c, peer
}

// frames reads n frames from peer (text frames and pongs alike) and
// returns their payloads, or an error.
func frames(peer net.Conn, n int) ([][]byte, error) {
	_ = peer.SetReadDeadline(time.Now().Add(30 * time.Second))
	var out [][]byte
	for range n {
		h, err := ws.ReadHeader(peer)
		if err != nil {
			return out, fmt.Errorf("frame %d of %d: %w", len(out)+1, n, err)
		}
		if h.OpCode != ws.OpText && h.OpCode != ws.OpPong || h.Length > 1<<20 {
			return out, fmt.Errorf("frame %d: opcode %v, %d bytes", len(out)+1, h.OpCode, h.Length)
		}
		p := make([]byte, h.Length)
		if _, err := io.ReadFull(peer, p); err != nil {
			return out, fmt.Errorf("frame %d of %d: %w", len(out)+1, n, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// TestWritesNeverWait: writes to a socket whose peer does not read return
// at once. The write the kernel does not take in full starts the backlog
// (stalled, once); the frames after it wait in the backlog, in order, up
// to MaxBacklog; Drain writes the backlog as the peer reads, and the peer
// gets every frame whole and in order.
func TestWritesNeverWait(t *testing.T) {
	c, peer := detachedPair(t)
	payload := bytes.Repeat([]byte("p"), 16<<10)
	written, stalls := 0, 0
	start := time.Now()
	c.Lock()
	for c.Stalled() == 0 {
		if written == 100_000 { // 1.6 GB: no socket buffer is that large
			t.Fatal("the socket never stalled")
		}
		payload[0] = byte('a' + written%26)
		stalled, err := c.WriteTextLocked(payload)
		if err != nil {
			t.Fatal(err)
		}
		if stalled {
			stalls++
		}
		written++
	}
	// More frames and a pong: they wait behind the backlog.
	for i := range 3 {
		payload[0] = byte('a' + (written+i)%26)
		if stalled, err := c.WriteTextLocked(payload); stalled || err != nil {
			t.Fatalf("a write behind the backlog: stalled %v, %v", stalled, err)
		}
	}
	written += 3
	if stalled, err := c.WriteControlLocked(ws.OpPong, []byte("hb")); stalled || err != nil {
		t.Fatalf("a pong behind the backlog: stalled %v, %v", stalled, err)
	}
	c.Unlock()
	if stalls != 1 {
		t.Errorf("%d writes said they stalled the socket, want 1", stalls)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("%d writes to a socket whose peer does not read took %v", written, d)
	}
	since := c.Stalled()
	if since == 0 || since > time.Now().UnixNano() {
		t.Fatalf("stalled since %d", since)
	}

	// The backlog is bounded: a frame that would pass MaxBacklog fails.
	big := make([]byte, socket.MaxBacklog)
	if _, err := c.WriteText(big); !errors.Is(err, socket.ErrTooSlow) || !socket.IsTimeout(err) {
		t.Errorf("a frame past the backlog's bound: %v, want ErrTooSlow", err)
	}

	// The peer reads; Drain writes the backlog each time a writable
	// poller reports the socket, as the gateway does.
	fd, ok := c.Fd()
	if !ok {
		t.Fatal("no descriptor")
	}
	p, err := netpoll.NewWritable()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	if err := p.Add(fd, 1); err != nil {
		t.Fatal(err)
	}
	type result struct {
		fs  [][]byte
		err error
	}
	got := make(chan result, 1)
	go func() {
		fs, err := frames(peer, written+1)
		got <- result{fs, err}
	}()
	for drains := 0; ; drains++ {
		if evs, err := p.Wait(nil, 30_000); err != nil || len(evs) != 1 {
			t.Fatalf("after %d drains: %v, %v; want the socket writable", drains, evs, err)
		}
		c.Lock()
		done, err := c.Drain()
		c.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if err := p.Resume(fd, 1); err != nil {
			t.Fatal(err)
		}
	}
	if c.Stalled() != 0 {
		t.Errorf("stalled after the backlog was written")
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	fs := r.fs
	for i, f := range fs[:written] {
		if len(f) != len(payload) || f[0] != byte('a'+i%26) {
			t.Fatalf("frame %d: %d bytes starting %q, want %d starting %q", i, len(f), f[:1], len(payload), string(rune('a'+i%26)))
		}
	}
	if string(fs[written]) != "hb" {
		t.Errorf("last frame %q, want the pong", fs[written])
	}

	// With no backlog, a write goes straight to the socket.
	if stalled, err := c.WriteText([]byte("after")); stalled || err != nil {
		t.Fatalf("write after the backlog: stalled %v, %v", stalled, err)
	}
	if f, err := frames(peer, 1); err != nil || string(f[0]) != "after" {
		t.Errorf("frame %q, %v; want after", f, err)
	}
}

// TestCloseWritesTheBacklog: a connection closed with a code writes its
// backlog before its close frame.
func TestCloseWritesTheBacklog(t *testing.T) {
	c, peer := detachedPair(t)
	payload := bytes.Repeat([]byte("q"), 64<<10)
	n := 0
	for c.Stalled() == 0 {
		if _, err := c.WriteText(payload); err != nil {
			t.Fatal(err)
		}
		n++
	}
	l := socket.NewLinger(1, 30*time.Second, 1<<20, 1<<10)
	read := make(chan error, 1)
	go func() {
		_ = peer.SetReadDeadline(time.Now().Add(30 * time.Second))
		for i := range n {
			p, _, err := wsutil.ReadServerData(peer)
			if err != nil || len(p) != len(payload) {
				read <- fmt.Errorf("frame %d of %d: %d bytes, %v", i+1, n, len(p), err)
				return
			}
		}
		// The close frame comes after every frame (and is answered).
		_, _, err := wsutil.ReadServerData(peer)
		var ce wsutil.ClosedError
		if !errors.As(err, &ce) || ce.Code != ws.StatusGoingAway {
			read <- fmt.Errorf("after the frames: %v, want a close frame 1001", err)
			return
		}
		_, err = io.Copy(io.Discard, peer)
		read <- err
	}()
	if !c.Close(ws.StatusGoingAway, "bye", l) {
		t.Fatal("Close did not close")
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	l.Stop()
}

// TestCorkHoldsWrites: a corked socket writes nothing until its last
// cork is undone; then the peer gets the prefix and every frame written
// meanwhile, in order, as one stream.
func TestCorkHoldsWrites(t *testing.T) {
	c, peer := detachedPair(t)
	prefix := []byte("HTTP/1.1 101 Switching Protocols\r\n\r\n")
	c.Lock()
	c.CorkLocked(prefix)
	for _, p := range []string{"one", "two"} {
		if _, err := c.WriteTextLocked([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	c.CorkLocked(nil)
	if _, err := c.WriteTextLocked([]byte("three")); err != nil {
		t.Fatal(err)
	}
	if stalled, err := c.UncorkLocked(); stalled || err != nil {
		t.Fatalf("inner uncork: stalled %v, %v", stalled, err)
	}
	_ = peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := peer.Read(make([]byte, 64)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("while corked the peer read %d bytes, %v; want nothing", n, err)
	}
	if stalled, err := c.UncorkLocked(); stalled || err != nil {
		t.Fatalf("last uncork: stalled %v, %v", stalled, err)
	}
	c.Unlock()
	_ = peer.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, len(prefix))
	if _, err := io.ReadFull(peer, got); err != nil || !bytes.Equal(got, prefix) {
		t.Fatalf("prefix %q, %v; want %q", got, err, prefix)
	}
	fs, err := frames(peer, 3)
	if err != nil {
		t.Fatal(err)
	}
	if g := fmt.Sprintf("%s", fs); g != "[one two three]" {
		t.Errorf("frames %s, want [one two three]", g)
	}
}
