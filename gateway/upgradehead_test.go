package gateway

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestUpgradeHeadKey: the Sec-WebSocket-Key of an upgrade's head is found
// however the head is read, a byte at a time too, in any case, and only in
// the head.
func TestUpgradeHeadKey(t *testing.T) {
	const good = "dGhlIHNhbXBsZSBub25jZQ=="
	head := func(lines ...string) string {
		return "GET /ws HTTP/1.1\r\nHost: x\r\n" + strings.Join(lines, "") + "\r\n"
	}
	for _, tt := range []struct {
		name, head string
		bad        bool
	}{
		{"one key", head("Sec-WebSocket-Key: " + good + "\r\n"), false},
		{"lower case, no space", head("sec-websocket-key:" + good + "\r\n"), false},
		{"a key after the head is not the head's", head("Sec-WebSocket-Key: "+good+"\r\n") + "Sec-WebSocket-Key: x\r\n", false},
		{"not base64", head("Sec-WebSocket-Key: !!!!!!!!!!!!!!!!!!!!!!==\r\n"), true},
		{"padding bits set", head("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZR==\r\n"), true},
		{"longer than a line is kept", head("Sec-WebSocket-Key: " + good + strings.Repeat(" ", 100) + "x\r\n"), true},
		{"two keys", head("Sec-WebSocket-Key: "+good+"\r\n", "Sec-WebSocket-Key: "+good+"\r\n"), true},
	} {
		for _, oneByte := range []bool{false, true} {
			var r io.Reader = strings.NewReader(tt.head)
			if oneByte {
				r = iotest.OneByteReader(r)
			}
			h := newUpgradeHead(r)
			if _, err := io.ReadAll(h); err != nil {
				t.Fatal(err)
			}
			err := h.check()
			if bad := err != nil; bad != tt.bad || bad && !errors.Is(err, ErrBadRequest) {
				t.Errorf("%s (a byte at a time: %v): %v, want bad %v", tt.name, oneByte, err, tt.bad)
			}
		}
	}
}
