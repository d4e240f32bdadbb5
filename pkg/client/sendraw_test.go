package client

import (
	"bytes"
	"net"
	"testing"

	"github.com/gobwas/ws"
)

// writesConn records each write.
type writesConn struct {
	net.Conn
	writes [][]byte
}

func (w *writesConn) Write(p []byte) (int, error) {
	w.writes = append(w.writes, append([]byte(nil), p...))
	return len(p), nil
}

// TestSendRawOneWrite: a frame is written in one write, masked, with the
// caller's payload unchanged; each frame has a key of its own.
func TestSendRawOneWrite(t *testing.T) {
	for _, size := range []int{0, 20, 125, 126, 70000} {
		w := &writesConn{}
		c := &Conn{nc: w}
		payload := bytes.Repeat([]byte("x"), size)
		for range 2 {
			if err := c.SendRaw(ws.OpText, payload); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(payload, bytes.Repeat([]byte("x"), size)) {
			t.Fatalf("size %d: the caller's payload was changed", size)
		}
		if len(w.writes) != 2 {
			t.Fatalf("size %d: %d writes for 2 frames, want 2", size, len(w.writes))
		}
		var masks [][4]byte
		for _, b := range w.writes {
			r := bytes.NewReader(b)
			h, err := ws.ReadHeader(r)
			if err != nil || h.Length != int64(r.Len()) {
				t.Fatalf("size %d: header %+v (%v) before %d bytes", size, h, err, r.Len())
			}
			f := ws.Frame{Header: h, Payload: b[len(b)-r.Len():]}
			if !f.Header.Masked || !f.Header.Fin || f.Header.OpCode != ws.OpText {
				t.Fatalf("size %d: header %+v, want a final masked text frame", size, f.Header)
			}
			masks = append(masks, f.Header.Mask)
			if f = ws.UnmaskFrameInPlace(f); !bytes.Equal(f.Payload, payload) {
				t.Fatalf("size %d: payload differs after unmasking", size)
			}
		}
		if size > 0 && masks[0] == masks[1] {
			t.Errorf("size %d: two frames with the same key %v", size, masks[0])
		}
	}
}
