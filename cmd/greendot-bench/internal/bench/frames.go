package bench

import (
	"errors"
	"io"
	"unicode/utf8"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsflate"

	"github.com/greendot/greendot/internal/wsframe"
)

// maxServerMessage bounds one message a gateway sends (a room_state of a
// large room is the largest): a decoder never holds more.
const maxServerMessage = 64 << 20

var (
	errMessageTooBig = errors.New("server message too big")
	errBadUTF8       = errors.New("server text is not valid UTF-8")
)

// frameSink receives what a frameDecoder finds: each whole message (its op
// code is that of its first frame: text or binary) and each control frame,
// in order. The payload is valid only during the call. An error stops the
// decoding and is returned by decode.
type frameSink interface {
	frame(op ws.OpCode, payload []byte) error
}

// frameDecoder turns the bytes a gateway sends, cut into reads anywhere,
// into messages and control frames, as a client reads them (frames are not
// masked). Between reads it holds only the start of an incomplete frame and
// the fragments of a message in progress, and nothing once they are
// complete: the decoder of an idle connection holds no memory.
//
// A frameDecoder is not safe for concurrent use. The zero value is ready.
type frameDecoder struct {
	// partial is the start of an incomplete frame; nil otherwise.
	partial []byte
	// frag is the payload of a fragmented message so far, fragOp its op
	// code; fragmented reports that one is in progress.
	frag       []byte
	fragOp     ws.OpCode
	fragmented bool
	// deflate says permessage-deflate was negotiated; fragZ that the
	// message in fragments came compressed.
	deflate, fragZ bool
}

// decode decodes data, which follows what earlier calls left, and passes
// each complete message and control frame to sink. data is not retained:
// an incomplete frame at its end is copied. It returns the first error of
// the stream (a protocol violation) or of sink; the connection then ends.
func (d *frameDecoder) decode(data []byte, sink frameSink) error {
	var own []byte // the decoder's buffer, when data is in it
	if len(d.partial) > 0 {
		own = append(d.partial, data...)
		data, d.partial = own, nil
	}
	for len(data) > 0 {
		h, hlen, err := wsframe.ParseHeader(data)
		if err != nil {
			return err
		}
		if hlen == 0 {
			d.keep(own, data, 0)
			return nil
		}
		state := ws.StateClientSide
		if d.fragmented {
			state = state.Set(ws.StateFragmented)
		}
		compressed := false
		if d.deflate {
			state = state.Set(ws.StateExtended)
			var ms wsflate.MessageState
			if h, err = ms.UnsetBits(h); err != nil {
				return err
			}
			compressed = ms.IsCompressed()
		}
		if err := ws.CheckHeader(h, state); err != nil {
			return err
		}
		if h.Length > maxServerMessage || int64(len(d.frag))+h.Length > maxServerMessage {
			return errMessageTooBig
		}
		if int64(len(data)-hlen) < h.Length {
			d.keep(own, data, hlen+int(h.Length))
			return nil
		}
		payload := data[hlen : hlen+int(h.Length)]
		data = data[hlen+int(h.Length):]
		switch {
		case h.OpCode.IsControl():
			err = sink.frame(h.OpCode, payload)
		case h.OpCode != ws.OpContinuation && h.Fin:
			err = d.message(h.OpCode, payload, compressed, sink)
		default: // the start or a continuation of a fragmented message
			if h.OpCode != ws.OpContinuation {
				d.fragOp, d.fragZ = h.OpCode, compressed
			}
			d.frag = append(d.frag, payload...)
			d.fragmented = true
			if h.Fin {
				msg, op, z := d.frag, d.fragOp, d.fragZ
				d.frag, d.fragmented, d.fragZ = nil, false, false
				err = d.message(op, msg, z, sink)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// message passes a whole message to sink, inflated if it came compressed,
// checking that text is UTF-8 as the client's reader does.
func (d *frameDecoder) message(op ws.OpCode, payload []byte, compressed bool, sink frameSink) error {
	if compressed {
		f, err := wsflate.DecompressFrame(ws.Frame{Header: ws.Header{Fin: true, OpCode: op, Rsv: ws.Rsv(true, false, false), Length: int64(len(payload))}, Payload: payload})
		if err != nil {
			return err
		}
		payload = f.Payload
	}
	if op == ws.OpText && !utf8.Valid(payload) {
		return errBadUTF8
	}
	return sink.frame(op, payload)
}

// keep keeps data, the start of an incomplete frame of need bytes (0 when
// its header is incomplete). own is the decoder's buffer data is in, if it
// is: it is reused when its size fits, so that a large frame arriving in
// many reads is copied once, not once per read.
func (d *frameDecoder) keep(own, data []byte, need int) {
	need = max(need, len(data))
	if own != nil && cap(own) >= need && cap(own) <= 2*need {
		if &own[0] != &data[0] { // frames before it were taken
			copy(own, data)
		}
		d.partial = own[:len(data)]
		return
	}
	d.partial = append(make([]byte, 0, need), data...)
}

// end reports why the stream ended at the end of the input: io.EOF at a
// frame boundary, io.ErrUnexpectedEOF within a frame, as the client's
// reader says.
func (d *frameDecoder) end() error {
	if len(d.partial) > 0 || d.fragmented {
		return io.ErrUnexpectedEOF
	}
	return io.EOF
}

// buffered reports how many bytes the decoder holds between calls.
func (d *frameDecoder) buffered() int { return len(d.partial) + len(d.frag) }
