//go:build linux

package netpoll_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/netpoll"
)

// pair returns a detached server end and a client end of a loopback TCP
// connection.
func pair(t *testing.T) (*netpoll.Conn, net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	dc, err := netpoll.Detach(server)
	if err != nil {
		t.Fatal(err)
	}
	c := dc.(*netpoll.Conn)
	t.Cleanup(func() { _ = c.Close() })
	return c, server, client
}

func TestConnReadWrite(t *testing.T) {
	c, orig, client := pair(t)
	if _, err := orig.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the detached net.Conn still writes: %v", err)
	}
	if got, want := c.RemoteAddr().String(), client.LocalAddr().String(); got != want {
		t.Errorf("RemoteAddr %s, want %s", got, want)
	}
	if got, want := c.LocalAddr().String(), client.RemoteAddr().String(); got != want {
		t.Errorf("LocalAddr %s, want %s", got, want)
	}
	msg := bytes.Repeat([]byte("greendot"), 1<<16) // more than a socket buffer
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		done <- err
	}()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	if err := <-done; err != nil {
		t.Fatalf("write: %v", err)
	}
	if _, err := client.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(buf); n != 0 || err != io.EOF {
		t.Errorf("read after the peer closed: %d, %v; want 0, EOF", n, err)
	}
}

func TestConnDeadlines(t *testing.T) {
	c, _, _ := pair(t)
	if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := c.Read(make([]byte, 8))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing to read: %v, want a timeout", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 5*time.Second {
		t.Errorf("read timed out after %v, want about 50ms", d)
	}
	// The peer never reads: a large write fills the buffers and times out.
	if err := c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	n, err := c.Write(make([]byte, 64<<20))
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("write to a peer that does not read: %d bytes, %v; want a timeout", n, err)
	}
	if n == 0 || n >= 64<<20 {
		t.Errorf("wrote %d bytes before the timeout, want some but not all", n)
	}
}

// TestConnCloseWakesWriter closes a Conn while a write waits for room: the
// write returns at once, and Close returns after it.
func TestConnCloseWakesWriter(t *testing.T) {
	c, _, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 64<<20)) // no deadline
		done <- err
	}()
	// Close comes before, during or after the write blocks: in every
	// case the write must end with an error and Close must return.
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a write interrupted by Close reported no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the blocked write")
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close: %v, want net.ErrClosed", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after Close: %v, want net.ErrClosed", err)
	}
	raw, _ := c.SyscallConn()
	if err := raw.Control(func(uintptr) { t.Error("Control ran after Close") }); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Control after Close: %v", err)
	}
}

// fdOf returns the descriptor of c.
func fdOf(t *testing.T, c *netpoll.Conn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// polled returns the descriptor of a detached server end, a poller that
// watches it with tag (released when the test ends; the test closes it),
// and the client end.
func polled(t *testing.T, tag uint64) (int, *netpoll.Poller, net.Conn) {
	t.Helper()
	c, _, client := pair(t)
	fd := fdOf(t, c)
	p, err := netpoll.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Release() })
	if err := p.Add(fd, tag); err != nil {
		t.Fatal(err)
	}
	return fd, p, client
}

// TestReadNow: nothing when the socket holds nothing, what it holds once
// the poller reports it readable, and io.EOF once the peer closed it.
func TestReadNow(t *testing.T) {
	fd, p, client := polled(t, 1)
	defer func() { _ = p.Close() }()
	readable := func() {
		t.Helper()
		if evs, err := p.Wait(nil, 10_000); err != nil || len(evs) != 1 {
			t.Fatalf("poll: %v, %v; want the socket readable", evs, err)
		}
	}
	buf := make([]byte, 64)
	if n, err := netpoll.ReadNow(fd, buf); n != 0 || err != nil {
		t.Fatalf("an empty socket: %d bytes, %v; want 0 and nil", n, err)
	}
	if _, err := client.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	readable()
	if n, err := netpoll.ReadNow(fd, buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v; want hello", buf[:n], err)
	}
	if err := p.Resume(fd, 1); err != nil {
		t.Fatal(err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	readable()
	if n, err := netpoll.ReadNow(fd, buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the peer closed: %d bytes, %v; want 0 and io.EOF", n, err)
	}
}

// TestPollerWait: Wait returns nothing when its time is up, waits without
// a bound after that for a descriptor to become readable, and ends with
// ErrClosed when the poller is closed while it waits.
func TestPollerWait(t *testing.T) {
	_, p, client := polled(t, 7)
	if evs, err := p.Wait(nil, 1); err != nil || len(evs) != 0 {
		t.Fatalf("nothing readable, 1 ms: %v, %v; want no events", evs, err)
	}

	type result struct {
		evs []netpoll.Event
		err error
	}
	waited := make(chan result, 1)
	go func() {
		evs, err := p.Wait(nil, -1)
		waited <- result{evs, err}
	}()
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-waited:
		if r.err != nil || len(r.evs) != 1 || r.evs[0].Tag != 7 || r.evs[0].Hangup {
			t.Fatalf("after a write: %v, %v; want tag 7 readable", r.evs, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a readable socket did not end the wait")
	}

	// The socket is reported once until Resume: this wait ends only with
	// the poller.
	go func() {
		evs, err := p.Wait(nil, -1)
		waited <- result{evs, err}
	}()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-waited:
		if !errors.Is(r.err, netpoll.ErrClosed) || len(r.evs) != 0 {
			t.Fatalf("after Close: %v, %v; want ErrClosed", r.evs, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the wait")
	}
}

// TestWriteNow: a socket whose peer does not read takes what fits in the
// kernel and then nothing, at once; a writable poller reports it once the
// peer has read, and WriteNow then takes more. Once the peer is gone,
// WriteNow fails.
func TestWriteNow(t *testing.T) {
	c, _, client := pair(t)
	fd := fdOf(t, c)
	p, err := netpoll.NewWritable()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Release() })

	chunk := bytes.Repeat([]byte("x"), 64<<10)
	total, full := 0, false
	for range 4096 { // at most 256 MiB: far more than any socket buffer
		n, err := netpoll.WriteNow(fd, chunk)
		if err != nil {
			t.Fatalf("write to a live socket: %v", err)
		}
		total += n
		if n < len(chunk) {
			full = true
			break
		}
	}
	if !full {
		t.Fatalf("%d bytes taken by a socket whose peer does not read, and still room", total)
	}
	if n, err := netpoll.WriteNow(fd, chunk); n != 0 || err != nil {
		t.Fatalf("a full socket took %d bytes, %v; want 0 and nil", n, err)
	}
	if err := p.Add(fd, 3); err != nil {
		t.Fatal(err)
	}
	if evs, err := p.Wait(nil, 0); err != nil || len(evs) != 0 {
		t.Fatalf("a full socket: %v, %v; want not writable", evs, err)
	}

	// The peer reads everything: the socket is writable again.
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(client, make([]byte, total))
		read <- err
	}()
	if evs, err := p.Wait(nil, 10_000); err != nil || len(evs) != 1 || evs[0].Tag != 3 {
		t.Fatalf("after the peer read: %v, %v; want tag 3 writable", evs, err)
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if n, err := netpoll.WriteNow(fd, []byte("more")); n != 4 || err != nil {
		t.Fatalf("a writable socket took %d bytes, %v; want 4", n, err)
	}

	// The peer is gone: the write fails (the first may still be taken
	// before the reset comes back).
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := netpoll.WriteNow(fd, []byte("after"))
		if err != nil {
			var se *os.SyscallError
			if !errors.As(err, &se) {
				t.Fatalf("error %T %v; want an *os.SyscallError", err, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a socket whose peer closed kept succeeding")
		}
		runtime.Gosched()
	}
}
