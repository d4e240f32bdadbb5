package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsflate"
)

// recorder keeps what a decoder finds.
type recorder struct{ got []string }

func (r *recorder) frame(op ws.OpCode, p []byte) error {
	r.got = append(r.got, fmt.Sprintf("%s:%s", map[ws.OpCode]string{ws.OpText: "text", ws.OpPing: "ping", ws.OpClose: "close"}[op], p))
	return nil
}

// serverFrame returns one frame as a gateway sends it: not masked.
func serverFrame(tb testing.TB, op ws.OpCode, fin bool, payload string) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := ws.WriteFrame(&buf, ws.NewFrame(op, fin, []byte(payload))); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// TestFrameDecoderSplits decodes a stream of frames cut into reads at
// every point, and at random points many times: what it finds does not
// depend on the cuts, and it holds nothing once the stream ends on a frame
// boundary.
func TestFrameDecoderSplits(t *testing.T) {
	long := strings.Repeat("presence ", 20000) // a 64-bit length
	var stream []byte
	var want []string
	add := func(op ws.OpCode, fin bool, payload string, shown ...string) {
		stream = append(stream, serverFrame(t, op, fin, payload)...)
		want = append(want, shown...)
	}
	add(ws.OpText, true, `{"type":"hello"}`, `text:{"type":"hello"}`)
	add(ws.OpText, true, strings.Repeat("x", 300), "text:"+strings.Repeat("x", 300)) // a 16-bit length
	add(ws.OpText, false, "frag", nil...)
	add(ws.OpPing, true, "p", "ping:p")
	add(ws.OpContinuation, false, "men", nil...)
	add(ws.OpContinuation, true, "ted", "text:fragmented")
	add(ws.OpText, true, long, "text:"+long)
	add(ws.OpText, true, "", "text:")
	add(ws.OpClose, true, string(ws.NewCloseFrameBody(ws.StatusGoingAway, "bye")), "close:"+string(ws.NewCloseFrameBody(ws.StatusGoingAway, "bye")))
	check := func(name string, cuts []int) {
		t.Helper()
		var d frameDecoder
		r := &recorder{}
		prev := 0
		for _, c := range append(cuts, len(stream)) {
			if err := d.decode(stream[prev:c], r); err != nil {
				t.Fatalf("%s: decode: %v", name, err)
			}
			prev = c
		}
		if len(r.got) != len(want) {
			t.Fatalf("%s: found %d frames, want %d", name, len(r.got), len(want))
		}
		for i := range want {
			if r.got[i] != want[i] {
				t.Fatalf("%s: frame %d is %.40q, want %.40q", name, i, r.got[i], want[i])
			}
		}
		if d.buffered() != 0 || d.partial != nil || d.frag != nil {
			t.Fatalf("%s: the decoder holds %d bytes after the last frame", name, d.buffered())
		}
		if err := d.end(); err != io.EOF {
			t.Errorf("%s: end %v, want io.EOF", name, err)
		}
	}
	check("whole", nil)
	// Every cut within the frames before the long one, in two reads.
	longAt := bytes.Index(stream, []byte("presence"))
	for c := 0; c <= longAt; c++ {
		check(fmt.Sprintf("cut at %d", c), []int{c})
	}
	// One byte a read: the long frame is copied into its buffer once.
	var d frameDecoder
	r := &recorder{}
	longFrame := len(serverFrame(t, ws.OpText, true, long))
	for i := range stream {
		if err := d.decode(stream[i:i+1], r); err != nil {
			t.Fatal(err)
		}
		if cap(d.partial) > 2*longFrame {
			t.Fatalf("after byte %d the decoder keeps %d bytes of room", i, cap(d.partial))
		}
	}
	if len(r.got) != len(want) || d.buffered() != 0 {
		t.Fatalf("one byte a read: found %d frames, want %d; %d bytes held", len(r.got), len(want), d.buffered())
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		var cuts []int
		for c := rng.IntN(40); c < len(stream); c += 1 + rng.IntN(4096) {
			cuts = append(cuts, c)
		}
		check(fmt.Sprintf("cuts %v", cuts), cuts)
	}
}

// TestFrameDecoderIncomplete checks what a decoder keeps while a frame is
// incomplete, and that the stream ending then is unexpected.
func TestFrameDecoderIncomplete(t *testing.T) {
	f := serverFrame(t, ws.OpText, true, "hello")
	var d frameDecoder
	r := &recorder{}
	if err := d.decode(f[:3], r); err != nil {
		t.Fatal(err)
	}
	if d.buffered() != 3 || len(r.got) != 0 {
		t.Fatalf("after 3 bytes of a frame: %d bytes held, %d frames", d.buffered(), len(r.got))
	}
	if err := d.end(); err != io.ErrUnexpectedEOF {
		t.Errorf("end within a frame: %v, want io.ErrUnexpectedEOF", err)
	}
	// The rest and a whole frame in one read.
	if err := d.decode(append(f[3:], f...), r); err != nil {
		t.Fatal(err)
	}
	if len(r.got) != 2 || d.partial != nil {
		t.Fatalf("found %d frames, hold %d bytes", len(r.got), d.buffered())
	}
}

// TestFrameDecoderErrors checks that a stream a gateway must not send ends
// the decoding with an error, and that a sink's error stops it.
func TestFrameDecoderErrors(t *testing.T) {
	masked := ws.MaskFrameInPlace(ws.NewTextFrame([]byte("x")))
	var mb bytes.Buffer
	if err := ws.WriteFrame(&mb, masked); err != nil {
		t.Fatal(err)
	}
	tooBig := []byte{0x81, 127, 0, 0, 0, 0, 0x10, 0, 0, 0}
	for name, data := range map[string][]byte{
		"masked":          mb.Bytes(),
		"too big":         tooBig,
		"bad utf-8":       serverFrame(t, ws.OpText, true, "\xff"),
		"stray continue":  serverFrame(t, ws.OpContinuation, true, "x"),
		"long control":    append([]byte{0x89, 126, 0, 200}, make([]byte, 200)...),
		"length top bit":  {0x81, 127, 0x80, 0, 0, 0, 0, 0, 0, 1},
		"fragmented ping": serverFrame(t, ws.OpPing, false, "x"),
	} {
		var d frameDecoder
		if err := d.decode(data, &recorder{}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	stop := errors.New("stop")
	var d frameDecoder
	n := 0
	sink := sinkFunc(func(ws.OpCode, []byte) error { n++; return stop })
	two := append(serverFrame(t, ws.OpText, true, "a"), serverFrame(t, ws.OpText, true, "b")...)
	if err := d.decode(two, sink); err != stop || n != 1 {
		t.Errorf("a sink's error: %v after %d frames, want it after 1", err, n)
	}
}

type sinkFunc func(ws.OpCode, []byte) error

func (f sinkFunc) frame(op ws.OpCode, p []byte) error { return f(op, p) }

// TestFrameDecoderDeflate: with permessage-deflate a compressed message,
// whole or in fragments around a ping, is inflated; without it, RSV1 is a
// protocol error.
func TestFrameDecoderDeflate(t *testing.T) {
	msg := `{"type":"presence_init","users":[` + strings.Repeat(`{"user_id":"u","status":"online"},`, 50) + `{}]}`
	zf, err := wsflate.CompressFrame(ws.NewTextFrame([]byte(msg)))
	if err != nil {
		t.Fatal(err)
	}
	z := zf.Payload
	frame := func(op ws.OpCode, fin, rsv1 bool, p []byte) []byte {
		f := ws.NewFrame(op, fin, p)
		f.Header.Rsv = ws.Rsv(rsv1, false, false)
		var b bytes.Buffer
		if err := ws.WriteFrame(&b, f); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	stream := bytes.Join([][]byte{
		frame(ws.OpText, true, true, z),
		frame(ws.OpText, false, true, z[:10]),
		frame(ws.OpPing, true, false, []byte("p")),
		frame(ws.OpContinuation, true, false, z[10:]),
		frame(ws.OpText, true, false, []byte("{}")),
	}, nil)
	d := frameDecoder{deflate: true}
	r := &recorder{}
	if err := d.decode(stream, r); err != nil {
		t.Fatal(err)
	}
	want := []string{"text:" + msg, "ping:p", "text:" + msg, "text:{}"}
	if fmt.Sprint(r.got) != fmt.Sprint(want) {
		t.Errorf("got %q, want %q", r.got, want)
	}
	var plain frameDecoder
	if err := plain.decode(frame(ws.OpText, true, true, z), &recorder{}); err == nil {
		t.Error("RSV1 without deflate decoded")
	}
}
