package socket

import (
	"bytes"
	"compress/flate"
	"errors"
	"io"
	"sync"

	"github.com/gobwas/ws"
)

// permessage-deflate (RFC 7692), as a gateway negotiates it: with
// server_no_context_takeover and client_no_context_takeover, so that each
// message is compressed and inflated on its own, with a flate writer or
// reader taken from a pool for that message and given back after it. An
// idle connection holds no flate state at all: a writer and a reader that
// kept their contexts would cost it about 1.2 MiB, the compressor most of
// it, the reader its 32 KiB window and tables
// (BenchmarkContextTakeoverMemory).

// DeflateMin is the smallest message a socket with deflate compresses:
// smaller ones (most presence updates, acks) gain nothing from a fresh
// deflate context, whose block header and the missing dictionary eat what
// it saves, and go out as they are, with RSV1 clear.
const DeflateMin = 512

// DeflateLevel is the compression level of outgoing messages:
// flate.BestSpeed, which keeps most of the default level's ratio on
// presence JSON at a fraction of its CPU (see docs/BENCHMARKS.md).
const DeflateLevel = flate.BestSpeed

// deflateTail is what RFC 7692 §7.2.1 has a sender remove from the end of
// each compressed message, and §7.2.2 a receiver append before inflating:
// the empty stored block a sync flush ends with.
var deflateTail = []byte{0x00, 0x00, 0xff, 0xff}

var writerPool = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, DeflateLevel) // no error for a valid level
	return w
}}

// Compress writes the permessage-deflate compression of payload to buf,
// as one message with no context taken over, and returns what buf then
// holds without the deflateTail RFC 7692 §7.2.1 removes.
func Compress(buf *bytes.Buffer, payload []byte) []byte {
	w := writerPool.Get().(*flate.Writer)
	w.Reset(buf)
	// Writes to a bytes.Buffer do not fail.
	_, _ = w.Write(payload)
	_ = w.Flush()
	w.Reset(nil)
	writerPool.Put(w)
	return bytes.TrimSuffix(buf.Bytes(), deflateTail)
}

// msgReader reads a message's compressed bytes, then deflateTail. It is
// an io.ByteReader, which flate reads without a buffer of its own.
type msgReader struct {
	p    []byte
	tail int // how much of deflateTail was read
}

func (r *msgReader) Read(b []byte) (int, error) {
	if len(r.p) > 0 {
		n := copy(b, r.p)
		r.p = r.p[n:]
		return n, nil
	}
	if r.tail == len(deflateTail) {
		return 0, io.EOF
	}
	n := copy(b, deflateTail[r.tail:])
	r.tail += n
	return n, nil
}

func (r *msgReader) ReadByte() (byte, error) {
	var b [1]byte
	if _, err := r.Read(b[:]); err != nil {
		return 0, err
	}
	return b[0], nil
}

// inflater is a pooled flate reader with what it reads from and into.
type inflater struct {
	fr  io.ReadCloser
	in  msgReader
	lim io.LimitedReader
	out bytes.Buffer
}

var inflaterPool = sync.Pool{New: func() any {
	f := new(inflater)
	f.in.tail = len(deflateTail)
	f.fr = flate.NewReader(&f.in)
	return f
}}

// The errors of inflating a message.
var (
	errInflateTooBig = &FrameError{ws.StatusMessageTooBig, "message too big once inflated"}
	errInflateBad    = &FrameError{ws.StatusInvalidFramePayloadData, "compressed message is not valid deflate data"}
)

// maxInflateBuffer bounds the output buffer an inflater keeps in its pool.
const maxInflateBuffer = 64 << 10

// inflate inflates the compressed message p, of at most maxMsg bytes once
// inflated, into an inflater whose out holds the message until its
// release. A message that inflates to more than maxMsg is refused as soon
// as its output passes maxMsg bytes (errInflateTooBig), which bounds what
// a small message made to inflate to much more (a zip bomb) costs: maxMsg
// bytes of output, never more.
func inflate(p []byte, maxMsg int) (*inflater, error) {
	f := inflaterPool.Get().(*inflater)
	f.in = msgReader{p: p}
	if err := f.fr.(flate.Resetter).Reset(&f.in, nil); err != nil {
		f.release()
		return nil, errInflateBad
	}
	f.out.Reset()
	f.lim = io.LimitedReader{R: f.fr, N: int64(maxMsg) + 1}
	_, err := f.out.ReadFrom(&f.lim)
	switch {
	case f.out.Len() > maxMsg:
		err = errInflateTooBig
	case err != nil && !errors.Is(err, io.ErrUnexpectedEOF):
		// A sync-flushed message has no final block: the reader runs out
		// of input right after deflateTail, which is its end.
		err = errInflateBad
	case len(f.in.p) > 0:
		// A final block before the end of the message: what follows it
		// is not deflate data.
		err = errInflateBad
	default:
		return f, nil
	}
	f.release()
	return nil, err
}

// release gives the inflater back to its pool.
func (f *inflater) release() {
	f.in = msgReader{tail: len(deflateTail)}
	f.lim = io.LimitedReader{}
	if f.out.Cap() > maxInflateBuffer {
		f.out = bytes.Buffer{}
	}
	inflaterPool.Put(f)
}
