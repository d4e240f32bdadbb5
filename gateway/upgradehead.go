package gateway

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
)

// upgradeHead is what gobwas/ws reads an upgrade request from: at most
// maxRequestHead bytes of it (headLimiter), whose head it watches for the
// header gobwas/ws checks only for its length and hands to no callback,
// Sec-WebSocket-Key. RFC 6455 §4.2.1 wants it once, the base64 of 16
// bytes; check says whether it was.
type upgradeHead struct {
	limit headLimiter
	// line holds the start of the header line being read, n its length
	// so far (which may be more than line holds).
	line [64]byte
	n    int
	// done says the head has ended: what follows is not looked at.
	done bool
	// keys counts the Sec-WebSocket-Key lines, bad says one was not the
	// base64 of 16 bytes.
	keys int
	bad  bool
}

// newUpgradeHead returns the head of the upgrade request r holds.
func newUpgradeHead(r io.Reader) *upgradeHead {
	return &upgradeHead{limit: headLimiter{r: r, n: maxRequestHead}}
}

func (h *upgradeHead) Read(p []byte) (int, error) {
	n, err := h.limit.Read(p)
	for b := p[:n]; len(b) > 0 && !h.done; {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			h.take(b)
			break
		}
		h.take(b[:i])
		b = b[i+1:]
		h.endLine()
	}
	return n, err
}

// take adds b to the line being read.
func (h *upgradeHead) take(b []byte) {
	if h.n < len(h.line) {
		copy(h.line[h.n:], b)
	}
	h.n += len(b)
}

// secKeyPrefix starts a Sec-WebSocket-Key header line, in lower case.
const secKeyPrefix = "sec-websocket-key:"

// endLine looks at the line just read.
func (h *upgradeHead) endLine() {
	line := bytes.TrimSuffix(h.line[:min(h.n, len(h.line))], []byte("\r"))
	switch {
	case len(line) == 0:
		h.done = true // the blank line that ends the head
	case len(line) >= len(secKeyPrefix) && bytes.EqualFold(line[:len(secKeyPrefix)], []byte(secKeyPrefix)):
		h.keys++
		h.bad = h.bad || h.n > len(h.line) || !validKey(bytes.TrimSpace(line[len(secKeyPrefix):]))
	}
	h.n = 0
}

// validKey reports whether k is the base64 of 16 bytes.
func validKey(k []byte) bool {
	if len(k) != 24 {
		return false
	}
	var b [18]byte
	n, err := base64.StdEncoding.Strict().Decode(b[:], k)
	return err == nil && n == 16
}

// check returns an error wrapping ErrBadRequest if the head had more than
// one Sec-WebSocket-Key, or one that is not the base64 of 16 bytes.
func (h *upgradeHead) check() error {
	switch {
	case h.keys > 1:
		return fmt.Errorf("%w: %d Sec-WebSocket-Key headers, want one", ErrBadRequest, h.keys)
	case h.bad:
		return fmt.Errorf("%w: Sec-WebSocket-Key is not the base64 of 16 bytes", ErrBadRequest)
	}
	return nil
}
