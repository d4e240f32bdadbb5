package gateway

// The HTTP edge: what the gateway bounds and refuses of an HTTP request
// before a handler reads it.

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// maxHeaderBytes is the HTTP server's MaxHeaderBytes: net/http reads up to
// 4 KiB more than it, so that a request's head is bounded by
// maxRequestHead, as an upgrade's is.
const maxHeaderBytes = maxRequestHead - 4<<10

// httpConn is a connection the handshake hands to the HTTP server, with
// the bytes it read of it to tell an upgrade from an API request.
//
// Its first request must be read within the handshake's deadline, which
// counts from the accept: until that request is answered, a read deadline
// net/http sets later than it (net/http counts from when it starts
// reading) is brought forward to it. A zero deadline, which net/http sets
// while a handler runs, is left as it is: a handler has its own bounds.
type httpConn struct {
	net.Conn
	r io.Reader
	// first is the first request's deadline, unix ns; 0 once it is
	// answered.
	first atomic.Int64
}

// newHTTPConn returns nc for the HTTP server, read goes first; the first
// request must be read by deadline. The HTTP server owns it.
func newHTTPConn(nc net.Conn, read []byte, deadline time.Time) *httpConn {
	c := &httpConn{Conn: nc, r: io.MultiReader(bytes.NewReader(read), nc)}
	c.first.Store(deadline.UnixNano())
	return c
}

func (c *httpConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// SetReadDeadline sets the read deadline, no later than the first
// request's until it is answered.
func (c *httpConn) SetReadDeadline(t time.Time) error {
	if first := c.first.Load(); first != 0 && !t.IsZero() && t.UnixNano() > first {
		t = time.Unix(0, first)
	}
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets the write deadline, and the read deadline as
// SetReadDeadline does.
func (c *httpConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

// CloseWrite shuts the write side down: net/http does before it closes a
// connection whose request it did not read whole, so that its answer is
// not destroyed by a reset.
func (c *httpConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// httpConnState is the HTTP server's ConnState: a connection whose first
// request was answered (it waits for the next) has the server's own
// deadlines from then on.
func httpConnState(nc net.Conn, st http.ConnState) {
	if c, ok := nc.(*httpConn); ok && st == http.StateIdle {
		c.first.Store(0)
	}
}

// refuseTransferEncoding answers a request with a Transfer-Encoding 400,
// and closes its connection, before h sees it. net/http reads a request
// with both Transfer-Encoding and Content-Length by the first (and drops
// the second), where a proxy in front may read it by the second: the
// rest of its body would be another request to one and not to the other
// (request smuggling), so RFC 9112 §6.1 has the connection closed. Which
// of them a request had is lost by then: a body with Transfer-Encoding is
// refused alone too, and a body needs Content-Length.
func refuseTransferEncoding(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) == 0 {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusBadRequest, "bad_request",
			"Transfer-Encoding is not accepted: send the body with Content-Length alone")
	})
}
