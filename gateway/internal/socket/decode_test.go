package socket

import (
	"bytes"
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
type countSink struct{ messages, fragments, controls int }

func (s *countSink) Message([]byte) bool            { s.messages++; return true }
func (s *countSink) Fragment([]byte) bool           { s.fragments++; return true }
func (s *countSink) Control(ws.OpCode, []byte) bool { s.controls++; return true }

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

// TestDecoderReportsEveryFrame: each frame reaches the sink once, the
// fragments of a message and the control frames between them included,
// so that a sink can count every frame a client sends.
func TestDecoderReportsEveryFrame(t *testing.T) {
	frame := func(op ws.OpCode, fin bool, payload string) []byte {
		var b bytes.Buffer
		if err := ws.WriteFrame(&b, ws.MaskFrameInPlace(ws.NewFrame(op, fin, []byte(payload)))); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	wire := bytes.Join([][]byte{
		frame(ws.OpText, false, `{"type":`),
		frame(ws.OpPong, true, ""),
		frame(ws.OpContinuation, false, ""),
		frame(ws.OpPing, true, "p"),
		frame(ws.OpContinuation, false, `"heartbeat"`),
		frame(ws.OpContinuation, true, "}"),
		frame(ws.OpPong, true, ""),
	}, nil)
	var d Decoder
	var sink countSink
	if err := d.Decode(wire, 4096, &sink); err != nil {
		t.Fatal(err)
	}
	if got, want := sink, (countSink{messages: 1, fragments: 3, controls: 3}); got != want {
		t.Errorf("sink saw %+v, want %+v", got, want)
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
