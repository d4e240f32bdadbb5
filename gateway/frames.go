package gateway

import (
	"encoding/binary"
	"unicode/utf8"

	"github.com/gobwas/ws"
)

// errFrame is a protocol violation found while decoding client frames. The
// connection is closed with code.
type errFrame struct {
	code   ws.StatusCode
	reason string
}

func (e *errFrame) Error() string { return e.reason }

var (
	errBinary   = &errFrame{ws.StatusUnsupportedData, "binary frames are not supported"}
	errTooBig   = &errFrame{ws.StatusMessageTooBig, "message too big"}
	errBadUTF8  = &errFrame{ws.StatusInvalidFramePayloadData, "text is not valid UTF-8"}
	errProtocol = func(err error) *errFrame { return &errFrame{ws.StatusProtocolError, err.Error()} }
)

// decoder turns the bytes a client sends into whole messages and control
// frames. It keeps what outlives one read (the start of an incomplete frame,
// the fragments of a message in progress) and nothing else, so the decoder
// of an idle connection holds no memory.
//
// A decoder is not safe for concurrent use; one goroutine reads a
// connection at a time.
type decoder struct {
	// partial holds the bytes of an incomplete frame.
	partial []byte
	// frag holds the payload of a fragmented text message so far.
	frag []byte
	// fragmented reports that a text message is in progress.
	fragmented bool
}

// frameSink receives what the decoder finds. message is called with a whole
// text message, control with a ping, pong or close frame. The payload is
// valid only during the call. Returning false stops decoding.
type frameSink interface {
	message(payload []byte) bool
	control(op ws.OpCode, payload []byte) bool
}

// decode decodes data, which follows whatever earlier calls left partial,
// and passes each complete message and control frame to sink. data is not
// retained; an incomplete frame at its end is copied. maxMsg bounds a
// message (and the frames it is made of).
//
// decode returns an *errFrame for a protocol violation, after which the
// connection must be closed; or nil. It returns nil early if sink asks to
// stop. Between calls the decoder holds at most maxMsg plus one frame
// header (ws.MaxHeaderSize) bytes, and what it finds does not depend on how
// the bytes are cut into calls.
func (d *decoder) decode(data []byte, maxMsg int, sink frameSink) error {
	if len(d.partial) > 0 {
		data = append(d.partial, data...)
		d.partial = nil
	}
	for len(data) > 0 {
		h, hlen, err := parseHeader(data)
		if err != nil {
			return errProtocol(err)
		}
		if hlen == 0 {
			d.keep(data)
			return nil
		}
		state := ws.StateServerSide
		if d.fragmented {
			state = state.Set(ws.StateFragmented)
		}
		if err := ws.CheckHeader(h, state); err != nil {
			return errProtocol(err)
		}
		if h.OpCode == ws.OpBinary {
			return errBinary
		}
		if h.Length > int64(maxMsg) || h.OpCode == ws.OpContinuation && int64(len(d.frag))+h.Length > int64(maxMsg) {
			return errTooBig
		}
		// A control frame between the fragments of a message shares the
		// message's budget: the decoder never holds more than maxMsg plus
		// one frame header, however the bytes arrive.
		if h.OpCode.IsControl() && d.fragmented && int64(len(d.frag)+hlen)+h.Length > int64(maxMsg+ws.MaxHeaderSize) {
			return errTooBig
		}
		if int64(len(data)-hlen) < h.Length {
			d.keep(data)
			return nil
		}
		payload := data[hlen : hlen+int(h.Length)]
		data = data[hlen+int(h.Length):]
		ws.Cipher(payload, h.Mask, 0)

		switch {
		case h.OpCode.IsControl():
			if !sink.control(h.OpCode, payload) {
				return nil
			}
		case h.OpCode == ws.OpText && h.Fin:
			if !utf8.Valid(payload) {
				return errBadUTF8
			}
			if !sink.message(payload) {
				return nil
			}
		default: // the start or a continuation of a fragmented message
			d.frag = append(d.frag, payload...)
			d.fragmented = true
			if !h.Fin {
				continue
			}
			msg := d.frag
			d.frag, d.fragmented = nil, false
			if !utf8.Valid(msg) {
				return errBadUTF8
			}
			if !sink.message(msg) {
				return nil
			}
		}
	}
	return nil
}

// parseHeader parses the frame header at the start of data, as
// ws.ReadHeader does, without a reader: it returns the header and its
// length, or a zero length when data holds only part of it. It does not
// allocate.
func parseHeader(data []byte) (h ws.Header, n int, err error) {
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

// keep copies the start of an incomplete frame.
func (d *decoder) keep(data []byte) {
	d.partial = append([]byte(nil), data...)
}

// buffered reports how many bytes the decoder holds.
func (d *decoder) buffered() int { return len(d.partial) + len(d.frag) }
