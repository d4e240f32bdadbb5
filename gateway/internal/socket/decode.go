package socket

import (
	"unicode/utf8"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsflate"

	"github.com/greendot/greendot/internal/wsframe"
)

// FrameError is a protocol violation found while decoding client frames.
// The connection must be closed with Code.
type FrameError struct {
	// Code is the close code the violation calls for.
	Code ws.StatusCode
	// Reason says what was wrong, for the close frame and the logs.
	Reason string
}

func (e *FrameError) Error() string { return e.Reason }

var (
	errBinary   = &FrameError{ws.StatusUnsupportedData, "binary frames are not supported"}
	errTooBig   = &FrameError{ws.StatusMessageTooBig, "message too big"}
	errBadUTF8  = &FrameError{ws.StatusInvalidFramePayloadData, "text is not valid UTF-8"}
	errProtocol = func(err error) *FrameError { return &FrameError{ws.StatusProtocolError, err.Error()} }
)

// Decoder turns the bytes a client sends into whole messages and control
// frames. It keeps what outlives one read (the start of an incomplete frame,
// the fragments of a message in progress) and nothing else, so the decoder
// of an idle connection holds no memory.
//
// A Decoder is not safe for concurrent use; one goroutine reads a
// connection at a time. The zero value is ready to use.
type Decoder struct {
	// partial holds the bytes of an incomplete frame.
	partial []byte
	// frag holds the payload of a fragmented text message so far.
	frag []byte
	// fragmented reports that a text message is in progress.
	fragmented bool
	// deflate says permessage-deflate was negotiated (Deflate): a data
	// message may come compressed, RSV1 set on its first frame.
	deflate bool
	// compressed says the message in progress came compressed.
	compressed bool
}

// Deflate has the decoder take messages compressed with permessage-deflate
// (RFC 7692), negotiated with client_no_context_takeover: each is
// inflated on its own, to at most the message size limit. Without it a
// frame with RSV1 set is a protocol error.
func (d *Decoder) Deflate() { d.deflate = true }

// Sink receives what a Decoder finds, one call for each frame: Message
// with a whole text message (for one in fragments, at its last frame),
// Fragment with each other frame of a message in fragments, Control with
// a ping, pong or close frame (also one between fragments). The payload is
// valid only during the call. Returning false stops decoding.
type Sink interface {
	Message(payload []byte) bool
	Fragment(payload []byte) bool
	Control(op ws.OpCode, payload []byte) bool
}

// Decode decodes data, which follows whatever earlier calls left partial,
// and passes each complete frame to sink. data is not
// retained; an incomplete frame at its end is copied. maxMsg bounds a
// message (and the frames it is made of).
//
// Decode returns a *FrameError for a protocol violation, after which the
// connection must be closed; or nil. It returns nil early if sink asks to
// stop, keeping what follows for the next call. Between calls the decoder
// holds at most maxMsg plus one frame header (ws.MaxHeaderSize) bytes,
// unless the sink asked to stop, and what it finds does not depend on how
// the bytes are cut into calls.
func (d *Decoder) Decode(data []byte, maxMsg int, sink Sink) error {
	if len(d.partial) > 0 {
		data = append(d.partial, data...)
		d.partial = nil
	}
	for len(data) > 0 {
		h, hlen, err := wsframe.ParseHeader(data)
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
		compressed := false
		if d.deflate {
			// RSV1 is the extension's, on the first frame of a data
			// message only (RFC 7692 §6); RSV2 and RSV3 stay errors.
			state = state.Set(ws.StateExtended)
			var ms wsflate.MessageState
			if h, err = ms.UnsetBits(h); err != nil {
				return errProtocol(err)
			}
			if h.Rsv != 0 {
				return errProtocol(ws.ErrProtocolNonZeroRsv)
			}
			compressed = ms.IsCompressed()
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
			if !sink.Control(h.OpCode, payload) {
				d.stopped(data)
				return nil
			}
		case h.OpCode == ws.OpText && h.Fin:
			ok, err := message(payload, compressed, maxMsg, sink)
			if err != nil {
				return err
			}
			if !ok {
				d.stopped(data)
				return nil
			}
		default: // the start or a continuation of a fragmented message
			d.frag = append(d.frag, payload...)
			if h.OpCode == ws.OpText {
				d.compressed = compressed
			}
			d.fragmented = true
			if !h.Fin {
				if !sink.Fragment(payload) {
					d.stopped(data)
					return nil
				}
				continue
			}
			msg, compressed := d.frag, d.compressed
			d.frag, d.fragmented, d.compressed = nil, false, false
			ok, err := message(msg, compressed, maxMsg, sink)
			if err != nil {
				return err
			}
			if !ok {
				d.stopped(data)
				return nil
			}
		}
	}
	return nil
}

// message hands the whole message msg to sink, inflated first if it came
// compressed, and reports what the sink said.
func message(msg []byte, compressed bool, maxMsg int, sink Sink) (bool, error) {
	if !compressed {
		if !utf8.Valid(msg) {
			return false, errBadUTF8
		}
		return sink.Message(msg), nil
	}
	f, err := inflate(msg, maxMsg)
	if err != nil {
		return false, err
	}
	defer f.release()
	if !utf8.Valid(f.out.Bytes()) {
		return false, errBadUTF8
	}
	return sink.Message(f.out.Bytes()), nil
}

// stopped keeps what follows the frame at which the sink asked to stop, so
// that a later call (a close that reads until the peer's close frame) goes
// on from the right byte. It may hold more than a frame then.
func (d *Decoder) stopped(rest []byte) {
	if len(rest) > 0 {
		d.keep(rest)
	}
}

// keep copies the start of an incomplete frame.
func (d *Decoder) keep(data []byte) {
	d.partial = append([]byte(nil), data...)
}

// Buffered reports how many bytes the decoder holds between calls.
func (d *Decoder) Buffered() int { return len(d.partial) + len(d.frag) }
