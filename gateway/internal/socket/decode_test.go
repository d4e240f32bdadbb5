package socket

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gobwas/ws"
)

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

func (s *countSink) Message([]byte) bool            { s.messages++; return true }
func (s *countSink) Control(ws.OpCode, []byte) bool { s.controls++; return true }

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
		var d Decoder
		var sink countSink
		n := testing.AllocsPerRun(100, func() {
			copy(buf, tc.wire)
			if err := d.Decode(buf, 4096, &sink); err != nil {
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

// BenchmarkDecoder decodes client frames as read from a socket into a sink
// that only counts: the WebSocket framing alone.
func BenchmarkDecoder(b *testing.B) {
	subscribe := `{"type":"subscribe","id":"s1","user_ids":["` + strings.Repeat(`user-0000","`, 99) + `user-0000"]}`
	for _, tc := range []struct {
		name    string
		payload string
		frames  int
	}{
		{"msg=heartbeat", `{"type":"heartbeat"}`, 1},
		{"msg=heartbeat/frames=16", `{"type":"heartbeat"}`, 16},
		{"msg=subscribe100", subscribe, 1},
	} {
		var wire []byte
		for range tc.frames {
			wire = append(wire, clientFrame(b, tc.payload)...)
		}
		buf := make([]byte, len(wire))
		b.Run(tc.name, func(b *testing.B) {
			var d Decoder
			var sink countSink
			b.ReportAllocs()
			b.SetBytes(int64(len(wire)))
			for b.Loop() {
				copy(buf, wire) // decoding unmasks in place
				if err := d.Decode(buf, 4096, &sink); err != nil {
					b.Fatal(err)
				}
			}
			if sink.messages != tc.frames*b.N {
				b.Fatalf("%d messages, want %d", sink.messages, tc.frames*b.N)
			}
		})
	}
}
