package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/pkg/presence"
)

// benchService returns a gateway that is not serving: enough for its hot
// paths (decoding, delivery, batching), which touch no NATS. The rate
// limit is lifted so that it never refuses a benchmark's frames.
func benchService(tb testing.TB) *Service {
	tb.Helper()
	s, err := New(nil, Config{DevAuth: true, RateLimit: 1e12, RateBurst: 1 << 30})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// benchConn returns a connection of s whose socket is one end of a
// loopback TCP connection; whatever is written to it is read and thrown
// away until the test ends.
func benchConn(tb testing.TB, s *Service, userID string) *conn {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	server, ok := <-accepted
	if !ok {
		tb.Fatal("accept failed")
	}
	go func() { _, _ = io.Copy(io.Discard, client) }()
	tb.Cleanup(func() {
		_ = server.Close()
		_ = client.Close()
	})
	c := s.newConn(identity{userID: userID})
	c.sock = socket.New(server, s.cfg.WriteTimeout)
	return c
}

// clientFrame returns payload as one masked text frame, as a client sends
// it.
func clientFrame(tb testing.TB, payload string) []byte {
	tb.Helper()
	var buf bytes.Buffer
	f := ws.MaskFrameInPlace(ws.NewTextFrame([]byte(payload)))
	if err := ws.WriteFrame(&buf, f); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkMessagePath decodes client frames as read from a socket into
// a connection: framing, rate limit, and recognising and counting the
// heartbeat. (The decoder alone is benchmarked in package socket.)
func BenchmarkMessagePath(b *testing.B) {
	s := benchService(b)
	for _, frames := range []int{1, 16} {
		var wire []byte
		for range frames {
			wire = append(wire, clientFrame(b, `{"type":"heartbeat"}`)...)
		}
		buf := make([]byte, len(wire))
		b.Run(fmt.Sprintf("msg=heartbeat/frames=%d", frames), func(b *testing.B) {
			c := benchConn(b, s, "alice")
			var d socket.Decoder
			b.ReportAllocs()
			b.SetBytes(int64(len(wire)))
			for b.Loop() {
				copy(buf, wire)
				if err := d.Decode(buf, s.cfg.MaxMessageSize, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDeliverFlush queues changes of distinct users for one socket,
// as the hub does, and writes them as one presence_batch frame to a real
// socket, as the scheduler does.
func BenchmarkDeliverFlush(b *testing.B) {
	s := benchService(b)
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("updates=%d", n), func(b *testing.B) {
			c := benchConn(b, s, "watcher")
			changes := make([]presence.Presence, n)
			for i := range changes {
				changes[i] = presence.Presence{UserID: fmt.Sprintf("user-%d", i), Status: presence.Online}
			}
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for b.Loop() {
				for i := range changes {
					c.box.Add(changes[i], 0)
				}
				buf, _ = c.Flush(buf[:0])
			}
		})
	}
}

// BenchmarkDeliver delivers one presence event to every socket watching
// its user, as the dispatcher does for each event from NATS.
func BenchmarkDeliver(b *testing.B) {
	for _, n := range []int{1, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("conns=%d", n), func(b *testing.B) {
			s := benchService(b)
			for i := range n {
				c := s.newConn(identity{userID: fmt.Sprintf("w%d", i)})
				if _, err := s.hub.Add(c, []hub.Grant{{User: "bob", LastSeen: i%2 == 0}}); err != nil {
					b.Fatal(err)
				}
				s.hub.Settle(c, []hub.Entry{{Presence: presence.Presence{UserID: "bob"}}})
				// Keep the socket queued, as a busy one is: delivering is
				// then coalescing into its box.
				c.box.Hold()
			}
			ev := presence.Event{UserID: "bob", Status: presence.Online, LastSeen: 1_760_000_000}
			b.ReportAllocs()
			for b.Loop() {
				ev.Rev++
				s.hub.Deliver(&ev)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/watcher")
		})
	}
}
