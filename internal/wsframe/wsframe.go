// Package wsframe parses WebSocket frame headers from a slice: for a
// reader of sockets that holds what arrived in a buffer of its own (the
// gateway's sockets, the load generator's) and must tell a whole header
// from part of one without blocking.
package wsframe

import (
	"encoding/binary"

	"github.com/gobwas/ws"
)

// ParseHeader parses the frame header at the start of data, as
// ws.ReadHeader does, without a reader: it returns the header and its
// length, or a zero length when data holds only part of it. It does not
// allocate.
func ParseHeader(data []byte) (h ws.Header, n int, err error) {
	if len(data) < 2 {
		return h, 0, nil
	}
	h.Fin = data[0]&0x80 != 0
	h.Rsv = (data[0] & 0x70) >> 4
	h.OpCode = ws.OpCode(data[0] & 0x0f)
	h.Masked = data[1]&0x80 != 0
	n = 2
	switch length := data[1] & 0x7f; length {
	case 126:
		if len(data) < n+2 {
			return h, 0, nil
		}
		h.Length = int64(binary.BigEndian.Uint16(data[n:]))
		n += 2
	case 127:
		if len(data) < n+8 {
			return h, 0, nil
		}
		if data[n]&0x80 != 0 {
			return h, 0, ws.ErrHeaderLengthMSB
		}
		h.Length = int64(binary.BigEndian.Uint64(data[n:]))
		n += 8
	default:
		h.Length = int64(length)
	}
	if h.Masked {
		if len(data) < n+4 {
			return h, 0, nil
		}
		copy(h.Mask[:], data[n:n+4])
		n += 4
	}
	return h, n, nil
}
