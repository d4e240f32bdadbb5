package gateway

import (
	"testing"
	"unsafe"

	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/internal/metricstest"
)

// TestHeartbeatPathAllocs pins a heartbeat's whole path through a
// connection (framing, rate limit, recognising it, counting it) at zero
// allocations, and checks that it still counts as a message and as a sign
// of life.
func TestHeartbeatPathAllocs(t *testing.T) {
	s := benchService(t)
	c := benchConn(t, s, "alice")
	wire := clientFrame(t, `{"type":"heartbeat"}`)
	buf := make([]byte, len(wire))
	var before int64
	var d socket.Decoder
	n := testing.AllocsPerRun(100, func() {
		copy(buf, wire)
		before = c.lastFrame.Load()
		if err := d.Decode(buf, DefaultMaxMessageSize, c); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per heartbeat, want 0", n)
	}
	if c.lastFrame.Load() <= before {
		t.Error("a heartbeat did not move the connection's last frame time")
	}
	for _, name := range []string{"greendot_gateway_messages_received_total", "greendot_gateway_heartbeats_total"} {
		var labels []string
		if name == "greendot_gateway_messages_received_total" {
			labels = []string{"type", "heartbeat"}
		}
		if v, ok := metricstest.Value(s.Registry(), name, labels...); !ok || v < 100 {
			t.Errorf("%s %v = %v (%v), want at least 100", name, labels, v, ok)
		}
	}
}

// TestConnFitsItsSizeClass: a connection object is allocated in Go's 448-byte
// size class; a field that made it larger would cost every connection 32
// bytes more (the next class is 480), idle or not.
func TestConnFitsItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(conn{}); n > 448 {
		t.Errorf("a connection takes %d bytes, more than the 448 of its size class", n)
	}
}

// TestUserStateFitsItsSizeClass: a user with connections here costs the
// registrar one userState, which fits the 240-byte size class (the next
// is 256).
func TestUserStateFitsItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(userState{}); n > 240 {
		t.Errorf("a user's state takes %d bytes, more than the 240 of its size class", n)
	}
}
