package wsframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/gobwas/ws"
)

// TestParseHeader checks ParseHeader against gobwas/ws's ReadHeader on
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
			got, n, err := ParseHeader(data)
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
				if _, n, err := ParseHeader(data[:cut]); n != 0 || err != nil {
					t.Fatalf("% x cut at %d: %d bytes, %v; want an incomplete header", data[:hlen], cut, n, err)
				}
			}
		}
	}
}
