package gateway

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/greendot/greendot/internal/metricstest"

	"github.com/gobwas/ws"
)

// TestParseHeader checks parseHeader against gobwas/ws's ReadHeader on
// every first two bytes, with short, 16-bit and 64-bit lengths, and on
// every truncation of each.
func TestParseHeader(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for b0 := range 256 {
		for b1 := range 256 {
			data := []byte{byte(b0), byte(b1)}
			switch b1 & 0x7f {
			case 126:
				data = binary.BigEndian.AppendUint16(data, uint16(rng.Uint32()))
			case 127:
				v := rng.Uint64()
				if b0%2 == 0 {
					v &^= 1 << 63 // both a valid length and one with its top bit set
				}
				data = binary.BigEndian.AppendUint64(data, v)
			}
			if b1&0x80 != 0 {
				data = binary.BigEndian.AppendUint32(data, rng.Uint32())
			}
			data = append(data, "payload"...)
			hlen := len(data) - len("payload")
			want, wantErr := ws.ReadHeader(bytes.NewReader(data))
			got, n, err := parseHeader(data)
			switch {
			case wantErr != nil:
				if err == nil || !errors.Is(err, wantErr) {
					t.Fatalf("% x: error %v, want %v", data[:hlen], err, wantErr)
				}
				continue
			case err != nil:
				t.Fatalf("% x: %v", data[:hlen], err)
			case got != want || n != hlen:
				t.Fatalf("% x: got %+v (%d bytes), want %+v (%d bytes)", data[:hlen], got, n, want, hlen)
			}
			for cut := range hlen {
				_, werr := ws.ReadHeader(bytes.NewReader(data[:cut]))
				if !errors.Is(werr, io.EOF) && !errors.Is(werr, io.ErrUnexpectedEOF) {
					t.Fatalf("% x cut at %d: ws.ReadHeader says %v", data[:hlen], cut, werr)
				}
				if _, n, err := parseHeader(data[:cut]); n != 0 || err != nil {
					t.Fatalf("% x cut at %d: %d bytes, %v; want an incomplete header", data[:hlen], cut, n, err)
				}
			}
		}
	}
}

// TestDecoderAllocs pins the frame decoder at zero allocations for whole
// frames: one message, several in one read, and a control frame.
func TestDecoderAllocs(t *testing.T) {
	for _, tc := range []struct {
		name string
		wire []byte
	}{
		{"heartbeat", clientFrame(t, `{"type":"heartbeat"}`)},
		{"three messages", bytes.Repeat(clientFrame(t, `{"type":"activity"}`), 3)},
		{"ping", func() []byte {
			var b bytes.Buffer
			if err := ws.WriteFrame(&b, ws.MaskFrameInPlace(ws.NewPingFrame([]byte("hi")))); err != nil {
				t.Fatal(err)
			}
			return b.Bytes()
		}()},
	} {
		buf := make([]byte, len(tc.wire))
		var d decoder
		var sink countSink
		n := testing.AllocsPerRun(100, func() {
			copy(buf, tc.wire)
			if err := d.decode(buf, DefaultMaxMessageSize, &sink); err != nil {
				t.Fatal(err)
			}
		})
		if n != 0 {
			t.Errorf("%s: %v allocations per decode, want 0", tc.name, n)
		}
		if sink.messages+sink.controls == 0 {
			t.Errorf("%s: nothing decoded", tc.name)
		}
	}
}

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
	n := testing.AllocsPerRun(100, func() {
		copy(buf, wire)
		before = c.lastFrame.Load()
		if err := c.dec.decode(buf, DefaultMaxMessageSize, c); err != nil {
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
