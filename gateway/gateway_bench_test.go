package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/gobwas/ws"

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
	return &conn{s: s, userID: userID, connID: "c-" + userID, nc: server}
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

// countSink counts what a decoder finds.
type countSink struct{ messages, controls int }

func (s *countSink) message([]byte) bool            { s.messages++; return true }
func (s *countSink) control(ws.OpCode, []byte) bool { s.controls++; return true }

// BenchmarkFrameDecoder decodes client frames as read from a socket: into
// a sink that only counts (the WebSocket framing alone), and into a
// connection (framing, rate limit, JSON and the heartbeat's handling).
func BenchmarkFrameDecoder(b *testing.B) {
	s := benchService(b)
	for _, tc := range []struct {
		name    string
		payload string
		frames  int
	}{
		{"msg=heartbeat", `{"type":"heartbeat"}`, 1},
		{"msg=heartbeat/frames=16", `{"type":"heartbeat"}`, 16},
		{"msg=subscribe100", subscribeJSON(100), 1},
	} {
		var wire []byte
		for range tc.frames {
			wire = append(wire, clientFrame(b, tc.payload)...)
		}
		buf := make([]byte, len(wire))
		b.Run(tc.name+"/sink=count", func(b *testing.B) {
			var d decoder
			var sink countSink
			b.ReportAllocs()
			b.SetBytes(int64(len(wire)))
			for b.Loop() {
				copy(buf, wire) // decoding unmasks in place
				if err := d.decode(buf, s.cfg.MaxMessageSize, &sink); err != nil {
					b.Fatal(err)
				}
			}
			if sink.messages != tc.frames*b.N {
				b.Fatalf("%d messages, want %d", sink.messages, tc.frames*b.N)
			}
		})
		if tc.name != "msg=heartbeat" && tc.name != "msg=heartbeat/frames=16" {
			continue // other messages need NATS behind the connection
		}
		b.Run(tc.name+"/sink=conn", func(b *testing.B) {
			c := benchConn(b, s, "alice")
			b.ReportAllocs()
			b.SetBytes(int64(len(wire)))
			for b.Loop() {
				copy(buf, wire)
				if err := c.dec.decode(buf, s.cfg.MaxMessageSize, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func subscribeJSON(n int) string {
	var b bytes.Buffer
	b.WriteString(`{"type":"subscribe","id":"s1","user_ids":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"user-%d"`, i)
	}
	b.WriteString("]}")
	return b.String()
}

// BenchmarkEnqueueFlush queues changes of distinct users for one socket,
// as the hub does, and flushes them as one presence_batch frame written to
// a real socket, as the flusher does each batch interval.
func BenchmarkEnqueueFlush(b *testing.B) {
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
					c.enqueue(changes[i], 0)
				}
				buf = c.flush(buf[:0])
				s.flusher.mu.Lock()
				clear(s.flusher.dirty)
				s.flusher.dirty = s.flusher.dirty[:0]
				s.flusher.mu.Unlock()
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
			t := &target{watchers: make(map[*conn]*watch, n)}
			s.hub.targets["bob"] = t
			for i := range n {
				c := &conn{s: s, userID: fmt.Sprintf("w%d", i)}
				w := &watch{lastSeen: i%2 == 0}
				t.watchers[c] = w
				c.subs = map[string]*watch{"bob": w}
			}
			ev := presence.Event{UserID: "bob", Status: presence.Online, LastSeen: 1_760_000_000}
			b.ReportAllocs()
			for b.Loop() {
				ev.Rev++
				s.hub.deliver(&ev)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/watcher")
		})
	}
}
