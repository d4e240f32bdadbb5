package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/greendot/greendot/pkg/client"
)

// countingConn counts the bytes written through it.
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

// TestTakeReading hands the reading of a connection to the caller: the
// bytes read past the hello frame come first, then the socket's; Read
// refuses; writes go through the connection swap returned.
func TestTakeReading(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var after bytes.Buffer
	for _, text := range []string{`{"type":"presence_batch"}`, `{"type":"error","code":"x"}`} {
		if err := ws.WriteFrame(&after, ws.NewTextFrame([]byte(text))); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan string, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		if _, err := ws.Upgrade(nc); err != nil {
			return
		}
		// The hello and the frames after it in one write: the client's
		// handshake reader may read past the hello.
		var out bytes.Buffer
		_ = ws.WriteFrame(&out, ws.NewTextFrame([]byte(`{"type":"hello","user_id":"alice"}`)))
		out.Write(after.Bytes())
		if _, err := nc.Write(out.Bytes()); err != nil {
			return
		}
		msg, err := wsutil.ReadClientText(nc)
		if err != nil {
			return
		}
		got <- string(msg)
	})
	c, err := client.Dial(context.Background(), "ws://"+ln.Addr().String()+"/ws", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Abort()
	if c.Hello.UserID != "alice" {
		t.Fatalf("hello %+v", c.Hello)
	}
	failed := errors.New("no")
	if _, err := c.TakeReading(func(net.Conn) (net.Conn, error) { return nil, failed }); err != failed {
		t.Fatalf("TakeReading with a failing swap: %v", err)
	}
	var cc *countingConn
	rest, err := c.TakeReading(func(nc net.Conn) (net.Conn, error) {
		cc = &countingConn{Conn: nc}
		return cc, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.NetConn() != net.Conn(cc) {
		t.Fatal("NetConn is not the swapped connection")
	}
	t.Logf("%d of %d bytes after the hello were read with it", len(rest), after.Len())
	stream := append([]byte(nil), rest...)
	for len(stream) < after.Len() {
		buf := make([]byte, after.Len()-len(stream))
		n, err := c.NetConn().Read(buf)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(stream), err)
		}
		stream = append(stream, buf[:n]...)
	}
	if !bytes.Equal(stream, after.Bytes()) {
		t.Fatalf("read %q after the hello, want %q", stream, after.Bytes())
	}
	if _, _, err := c.Read(); !errors.Is(err, client.ErrReadingTaken) {
		t.Errorf("Read after TakeReading: %v", err)
	}
	if _, err := c.TakeReading(nil); !errors.Is(err, client.ErrReadingTaken) {
		t.Errorf("TakeReading again: %v", err)
	}
	if err := c.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if msg := <-got; msg != `{"type":"heartbeat"}` {
		t.Errorf("the gateway read %q", msg)
	}
	if cc.written.Load() == 0 {
		t.Error("the heartbeat was not written through the swapped connection")
	}
	if _, err := io.ReadAll(c.NetConn()); err != nil {
		t.Errorf("read to the end: %v", err)
	}
}
