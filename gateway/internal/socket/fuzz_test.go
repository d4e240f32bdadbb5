package socket

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/gobwas/ws"
)

// FuzzFrameDecoder's seed corpus is checked in under
// testdata/fuzz/FuzzFrameDecoder/ and runs with every `go test`; to fuzz:
//
//	go test ./gateway/internal/socket -run '^$' -fuzz '^FuzzFrameDecoder$' -fuzztime 20s

// fuzzMaxMsg is the message size limit of FuzzFrameDecoder: the smallest a
// gateway can be configured with, so that the fuzzer reaches it easily.
const fuzzMaxMsg = 256

// decoded is what a decoder passed to its sink: a message (op 0), a
// fragment of one (op ws.OpText) or a control frame.
type decoded struct {
	op      ws.OpCode
	payload string
}

// recorder is a Sink that records what it is given.
type recorder struct{ got []decoded }

func (r *recorder) Message(p []byte) bool {
	r.got = append(r.got, decoded{0, string(p)})
	return true
}

func (r *recorder) Fragment(p []byte) bool {
	r.got = append(r.got, decoded{ws.OpText, string(p)})
	return true
}

func (r *recorder) Control(op ws.OpCode, p []byte) bool {
	r.got = append(r.got, decoded{op, string(p)})
	return true
}

// FuzzFrameDecoder feeds arbitrary bytes, cut into arbitrary pieces, to the
// decoder that turns what a socket reads into messages, fragments and
// control frames. It must never panic, never hold more than the message size limit
// plus a frame header (14 bytes), hand over only valid UTF-8 messages
// within the limit and control payloads of at most 125 bytes, and find the
// same messages, fragments and control frames, and the same error, however
// the bytes are cut.
func FuzzFrameDecoder(f *testing.F) {
	mask := func(op ws.OpCode, fin bool, payload string) []byte {
		fr := ws.NewFrame(op, fin, []byte(payload))
		fr = ws.MaskFrameInPlaceWith(fr, [4]byte{0x5a, 0x01, 0xc3, 0x7e})
		b, err := ws.CompileFrame(fr)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	join := func(frames ...[]byte) []byte { return bytes.Join(frames, nil) }
	seeds := [][]byte{
		mask(ws.OpText, true, `{"type":"heartbeat"}`),
		join(mask(ws.OpText, false, `{"type":`), mask(ws.OpPing, true, "p"), mask(ws.OpContinuation, true, `"idle"}`)),
		join(mask(ws.OpText, true, "a"), mask(ws.OpText, true, "b"), mask(ws.OpClose, true, "\x03\xe8bye")),
		mask(ws.OpBinary, true, "x"),
		mask(ws.OpText, true, string(make([]byte, fuzzMaxMsg+1))),
		mask(ws.OpText, true, "\xff"),
		{0x81, 0x05, 'h', 'e', 'l', 'l', 'o'},               // unmasked
		{0x83, 0x80, 1, 2, 3, 4},                            // reserved op code
		{0x09, 0x80, 1, 2, 3, 4},                            // fragmented ping
		{0x81, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}, // length with the top bit set
	}
	// A ping in the middle of a fragmented message of the largest size,
	// arriving in pieces.
	f.Add(join(mask(ws.OpText, false, string(bytes.Repeat([]byte("m"), fuzzMaxMsg))),
		mask(ws.OpPing, true, string(bytes.Repeat([]byte("p"), ws.MaxControlFramePayloadSize))),
		mask(ws.OpContinuation, true, "")), []byte{255, 100})
	for _, s := range seeds {
		f.Add(s, []byte{0})
		f.Add(s, []byte{2, 5, 0, 200})
	}
	f.Fuzz(func(t *testing.T, data, cuts []byte) { fuzzDecode(t, data, cuts, false) })
}

// fuzzDecode decodes data whole and cut into pieces by cuts, with a
// decoder that takes compressed messages or not, and fails t unless both
// hand over the same valid frames and end the same way.
func fuzzDecode(t *testing.T, data, cuts []byte, deflate bool) {
	var whole Decoder
	if deflate {
		whole.Deflate()
	}
	wr := &recorder{}
	werr := whole.Decode(bytes.Clone(data), fuzzMaxMsg, wr)
	checkDecoded(t, wr.got)

	var pieces Decoder
	if deflate {
		pieces.Deflate()
	}
	pr := &recorder{}
	var perr error
	rest := data
	for i := 0; len(rest) > 0; i++ {
		n := len(rest)
		if len(cuts) > 0 {
			n = min(n, int(cuts[i%len(cuts)])+1)
		}
		// A fresh slice each time: the decoder must not keep what it
		// is given.
		chunk := bytes.Clone(rest[:n])
		rest = rest[n:]
		perr = pieces.Decode(chunk, fuzzMaxMsg, pr)
		clear(chunk)
		if perr != nil {
			break
		}
		if held := pieces.Buffered(); held > fuzzMaxMsg+ws.MaxHeaderSize {
			t.Fatalf("decoder holds %d bytes, more than %d+%d", held, fuzzMaxMsg, ws.MaxHeaderSize)
		}
	}
	if !reflect.DeepEqual(wr.got, pr.got) {
		t.Fatalf("whole: %q; in pieces: %q", wr.got, pr.got)
	}
	var wf, pf *FrameError
	switch {
	case (werr == nil) != (perr == nil):
		t.Fatalf("whole: %v; in pieces: %v", werr, perr)
	case werr != nil && (!errors.As(werr, &wf) || !errors.As(perr, &pf)):
		t.Fatalf("errors are not protocol violations: %v, %v", werr, perr)
	case werr != nil && (wf.Code != pf.Code || wf.Reason != pf.Reason):
		t.Fatalf("whole: %d %s; in pieces: %d %s", wf.Code, wf.Reason, pf.Code, pf.Reason)
	case werr == nil && whole.Buffered() != pieces.Buffered():
		t.Fatalf("whole holds %d bytes, in pieces %d", whole.Buffered(), pieces.Buffered())
	}
	if werr == nil && whole.Buffered() > fuzzMaxMsg+ws.MaxHeaderSize {
		t.Fatalf("decoder holds %d bytes", whole.Buffered())
	}
}

// checkDecoded checks what a decoder handed over.
func checkDecoded(t *testing.T, got []decoded) {
	t.Helper()
	for _, d := range got {
		switch d.op {
		case 0:
			if len(d.payload) > fuzzMaxMsg || !utf8.ValidString(d.payload) {
				t.Fatalf("message of %d bytes handed over: %q", len(d.payload), d.payload)
			}
		case ws.OpText:
			if len(d.payload) > fuzzMaxMsg {
				t.Fatalf("fragment of %d bytes handed over", len(d.payload))
			}
		case ws.OpPing, ws.OpPong, ws.OpClose:
			if len(d.payload) > ws.MaxControlFramePayloadSize {
				t.Fatalf("control frame of %d bytes handed over", len(d.payload))
			}
		default:
			t.Fatalf("op code %v handed over", d.op)
		}
	}
}
