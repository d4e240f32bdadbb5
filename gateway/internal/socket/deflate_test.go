package socket

import (
	"bytes"
	"compress/flate"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

// compressed returns msg compressed as a permessage-deflate message with
// no context taken over: what a browser sends, once the tail is removed.
func compressed(tb testing.TB, msg string) []byte {
	tb.Helper()
	var b bytes.Buffer
	return bytes.Clone(Compress(&b, []byte(msg)))
}

// rawFrame returns one masked frame with the given RSV1 bit.
func rawFrame(tb testing.TB, op ws.OpCode, fin, rsv1 bool, payload []byte) []byte {
	tb.Helper()
	f := ws.NewFrame(op, fin, bytes.Clone(payload))
	f.Header.Rsv = ws.Rsv(rsv1, false, false)
	f = ws.MaskFrameInPlaceWith(f, [4]byte{0x5a, 0x01, 0xc3, 0x7e})
	b, err := ws.CompileFrame(f)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// decodeAll decodes wire with a decoder that has deflate or not, and
// returns what it found and its error.
func decodeAll(wire []byte, deflate bool, maxMsg int) ([]decoded, error) {
	var d Decoder
	if deflate {
		d.Deflate()
	}
	r := &recorder{}
	err := d.Decode(wire, maxMsg, r)
	return r.got, err
}

// frameCode returns the close code of a decoder's error, 0 if none.
func frameCode(t *testing.T, err error) ws.StatusCode {
	t.Helper()
	if err == nil {
		return 0
	}
	var fe *FrameError
	if !errors.As(err, &fe) {
		t.Fatalf("%v is not a FrameError", err)
	}
	return fe.Code
}

// presenceJSON is a message worth compressing.
var presenceJSON = `{"type":"presence_init","users":[` + strings.Repeat(`{"user_id":"user-12345","status":"online","platforms":["web"]},`, 40) + `{}]}`

// TestDeflateDecoder: a compressed message, whole or in fragments (with
// a ping between them), inflates to what was compressed; RSV1 without
// deflate, on a continuation or a control frame, RSV2, bad deflate data
// and a message over the limit once inflated are refused with the codes
// RFC 6455 and RFC 7692 call for.
func TestDeflateDecoder(t *testing.T) {
	z := compressed(t, presenceJSON)
	third := len(z) / 3
	for _, tc := range []struct {
		name    string
		wire    []byte
		deflate bool
		want    string // the message, if one
		code    ws.StatusCode
	}{
		{"whole", rawFrame(t, ws.OpText, true, true, z), true, presenceJSON, 0},
		{"uncompressed with deflate", rawFrame(t, ws.OpText, true, false, []byte(`{"type":"heartbeat"}`)), true, `{"type":"heartbeat"}`, 0},
		{"fragments", bytes.Join([][]byte{
			rawFrame(t, ws.OpText, false, true, z[:third]),
			rawFrame(t, ws.OpPing, true, false, []byte("p")),
			rawFrame(t, ws.OpContinuation, false, false, z[third:2*third]),
			rawFrame(t, ws.OpContinuation, true, false, z[2*third:]),
		}, nil), true, presenceJSON, 0},
		{"final block", rawFrame(t, ws.OpText, true, true, func() []byte {
			var b bytes.Buffer
			w, _ := flate.NewWriter(&b, flate.BestCompression)
			_, _ = io.WriteString(w, presenceJSON)
			_ = w.Close()
			return b.Bytes()
		}()), true, presenceJSON, 0},
		{"rsv1 without deflate", rawFrame(t, ws.OpText, true, true, z), false, "", ws.StatusProtocolError},
		{"rsv1 on a continuation", bytes.Join([][]byte{
			rawFrame(t, ws.OpText, false, true, z[:third]),
			rawFrame(t, ws.OpContinuation, true, true, z[third:]),
		}, nil), true, "", ws.StatusProtocolError},
		{"rsv1 on a ping", rawFrame(t, ws.OpPing, true, true, []byte("p")), true, "", ws.StatusProtocolError},
		{"rsv2", func() []byte {
			b := rawFrame(t, ws.OpText, true, false, []byte("{}"))
			b[0] |= 0x20
			return b
		}(), true, "", ws.StatusProtocolError},
		{"not deflate", rawFrame(t, ws.OpText, true, true, []byte{0xff, 0xff, 0xff, 0xff}), true, "", ws.StatusInvalidFramePayloadData},
		{"data after a final block", rawFrame(t, ws.OpText, true, true, []byte{0x03, 0x00, 'x', 'y'}), true, "", ws.StatusInvalidFramePayloadData},
		{"not utf-8 once inflated", rawFrame(t, ws.OpText, true, true, compressed(t, "\xff\xfe")), true, "", ws.StatusInvalidFramePayloadData},
		{"over the limit once inflated", rawFrame(t, ws.OpText, true, true, compressed(t, strings.Repeat("a", 4097))), true, "", ws.StatusMessageTooBig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeAll(tc.wire, tc.deflate, 4096)
			if c := frameCode(t, err); c != tc.code {
				t.Fatalf("close code %d (%v), want %d", c, err, tc.code)
			}
			var msgs []string
			for _, d := range got {
				if d.op == 0 {
					msgs = append(msgs, d.payload)
				}
			}
			switch {
			case tc.want != "" && (len(msgs) != 1 || msgs[0] != tc.want):
				t.Fatalf("messages %q, want %q", msgs, tc.want)
			case tc.want == "" && len(msgs) > 0:
				t.Fatalf("messages %q handed over", msgs)
			}
		})
	}
}

// TestDeflateBomb: 4 MiB of zeros, compressed to a frame under the 4 KiB
// limit, is refused with 1009 once its output passes the limit, having
// inflated little more than the limit: in a tenth of what inflating it all
// takes, at most.
func TestDeflateBomb(t *testing.T) {
	var b bytes.Buffer
	w, _ := flate.NewWriter(&b, flate.BestCompression)
	_, _ = w.Write(make([]byte, 4<<20))
	_ = w.Flush()
	z := bytes.TrimSuffix(b.Bytes(), deflateTail)
	if len(z) > 4096 {
		t.Fatalf("bomb of %d bytes, over the limit", len(z))
	}
	wire := rawFrame(t, ws.OpText, true, true, z)
	_, err := decodeAll(bytes.Clone(wire), true, 4096)
	if c := frameCode(t, err); c != ws.StatusMessageTooBig {
		t.Fatalf("close code %d (%v), want 1009", c, err)
	}
	// Its cost: the best of 5 refusals against inflating all of it once,
	// on the same (loaded, perhaps race-instrumented) machine.
	refuse := time.Duration(1 << 62)
	for range 5 {
		start := time.Now()
		_, _ = decodeAll(bytes.Clone(wire), true, 4096)
		refuse = min(refuse, time.Since(start))
	}
	start := time.Now()
	n, _ := io.Copy(io.Discard, flate.NewReader(bytes.NewReader(b.Bytes())))
	whole := time.Since(start)
	if n != 4<<20 {
		t.Fatalf("the bomb inflates to %d bytes", n)
	}
	if refuse > whole/10 {
		t.Errorf("refusing the bomb took %v, inflating it all %v", refuse, whole)
	}
}

// TestDeflateWrites: a socket with deflate writes a message of
// DeflateMin bytes or more compressed, RSV1 set, which inflates to it,
// and a smaller one as it is; without deflate, nothing is compressed.
func TestDeflateWrites(t *testing.T) {
	small := `{"type":"self","status":"online"}`
	for _, deflate := range []bool{true, false} {
		client, server := net.Pipe()
		sc := New(server, 5*time.Second)
		if deflate {
			sc.Deflate()
		}
		go func() {
			for _, m := range []string{presenceJSON, small} {
				if _, err := sc.WriteText([]byte(m)); err != nil {
					t.Error(err)
				}
			}
		}()
		for i, want := range []string{presenceJSON, small} {
			h, err := ws.ReadHeader(client)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, h.Length)
			if _, err := io.ReadFull(client, got); err != nil {
				t.Fatal(err)
			}
			rsv1 := h.Rsv&0x4 != 0
			wantRsv1 := deflate && i == 0
			if rsv1 != wantRsv1 {
				t.Fatalf("deflate %v, message %d: RSV1 %v, want %v", deflate, i, rsv1, wantRsv1)
			}
			if rsv1 {
				if len(got) >= len(want)/4 {
					t.Errorf("compressed to %d bytes of %d", len(got), len(want))
				}
				fr := flate.NewReader(io.MultiReader(bytes.NewReader(got), bytes.NewReader(deflateTail)))
				got, err = io.ReadAll(fr)
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatal(err)
				}
			}
			if string(got) != want {
				t.Fatalf("message %d is %q", i, got)
			}
		}
		_ = client.Close()
		sc.Close(0, "", nil)
	}
}

// FuzzDeflateDecoder is FuzzFrameDecoder with permessage-deflate
// negotiated: compressed messages, whole or in fragments, bombs and
// broken deflate data among its seeds. Its corpus is under
// testdata/fuzz/FuzzDeflateDecoder/; to fuzz:
//
//	go test ./gateway/internal/socket -run '^$' -fuzz '^FuzzDeflateDecoder$' -fuzztime 20s
func FuzzDeflateDecoder(f *testing.F) {
	z := compressed(f, `{"type":"heartbeat","status":"online","status":"online"}`)
	bomb := compressed(f, string(make([]byte, 64<<10)))
	seeds := [][]byte{
		rawFrame(f, ws.OpText, true, true, z),
		bytes.Join([][]byte{
			rawFrame(f, ws.OpText, false, true, z[:5]),
			rawFrame(f, ws.OpPing, true, false, []byte("p")),
			rawFrame(f, ws.OpContinuation, true, false, z[5:]),
		}, nil),
		rawFrame(f, ws.OpText, true, true, bomb),
		rawFrame(f, ws.OpText, true, true, []byte{0xff, 0x00}),
		rawFrame(f, ws.OpContinuation, true, true, z),
		rawFrame(f, ws.OpPong, true, true, nil),
		rawFrame(f, ws.OpText, true, false, []byte(`{"type":"idle"}`)),
	}
	for _, s := range seeds {
		f.Add(s, []byte{0})
		f.Add(s, []byte{2, 5, 0, 200})
	}
	f.Fuzz(func(t *testing.T, data, cuts []byte) { fuzzDecode(t, data, cuts, true) })
}
