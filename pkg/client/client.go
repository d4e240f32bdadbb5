package client

import (
	"bufio"
	"bytes"
	"compress/flate"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gobwas/httphead"
	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsflate"
	"github.com/gobwas/ws/wsutil"

	"github.com/greendot/greendot/pkg/protocol"
)

// HandshakeError is a refused upgrade: the gateway answered with an HTTP
// status instead of 101.
type HandshakeError struct {
	Status int
	Body   string
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("upgrade refused: %d %s: %s", e.Status, http.StatusText(e.Status), e.Body)
}

// CloseError is the gateway closing the WebSocket with a close frame.
type CloseError struct {
	Code   ws.StatusCode
	Reason string
}

func (e *CloseError) Error() string { return fmt.Sprintf("closed by server: %d %s", e.Code, e.Reason) }

// Options configures Dial. The zero value is usable.
type Options struct {
	// Header holds extra request headers (Authorization, Origin).
	Header http.Header
	// LocalAddr is the local address to dial from, such as 127.0.0.2:0, to
	// spread many connections over source addresses. On Linux the port is
	// chosen at connect, not at bind (IP_BIND_ADDRESS_NO_PORT).
	LocalAddr net.Addr
	// Timeout bounds the dial, the handshake and the hello frame; zero
	// means 10s.
	Timeout time.Duration
	// TLSConfig is the TLS configuration of a wss:// URL (the roots a
	// gateway's certificate is checked against, say); nil means the
	// system's.
	TLSConfig *tls.Config
	// Compression offers permessage-deflate (RFC 7692), with no context
	// takeover either way, as a gateway answers it: the gateway's
	// compressed messages are then inflated by Read, transparently.
	// Messages the client sends go uncompressed. Compressed says whether
	// the gateway accepted.
	Compression bool
}

// Conn is a client WebSocket to a gateway. Send may be called
// concurrently with Read; Read must be called from one goroutine at a time.
type Conn struct {
	nc net.Conn
	rd *wsutil.Reader // nil after TakeReading
	// deflate says permessage-deflate was negotiated; msg says whether
	// the message being read came compressed, and inflater inflates it.
	deflate  bool
	msg      wsflate.MessageState
	inflater *wsflate.Reader
	br       *bufio.Reader // what the handshake read past its response; may be nil
	ctl      wsutil.ControlHandler
	wmu      sync.Mutex

	// onFrame, when set, is called for every frame Read reads, control
	// frames included: Client uses it to see that the gateway is alive.
	onFrame func()
	// writeTimeout, when set, bounds the writes of Read's answers (pong,
	// close), which come whenever the gateway asks: Client sets it, as a
	// deadline its own writes set may have passed long ago.
	writeTimeout time.Duration
	// life is that of the token Client got from TokenFunc to open it,
	// which it renews in place; zero otherwise.
	life tokenLife

	// Hello is the hello frame the gateway sent first.
	Hello protocol.ServerMessage
}

// Dial connects to url (ws://host:port/ws?...) and reads the hello frame.
// A refused upgrade returns a *HandshakeError.
func Dial(ctx context.Context, url string, o Options) (*Conn, error) {
	timeout := o.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var refused *HandshakeError
	d := ws.Dialer{
		Timeout:   timeout,
		TLSConfig: o.TLSConfig,
		OnStatusError: func(status int, reason []byte, resp io.Reader) {
			// resp is the whole response, status line and headers first.
			refused = &HandshakeError{Status: status}
			if r, err := http.ReadResponse(bufio.NewReader(io.LimitReader(resp, 8192)), nil); err == nil {
				body, _ := io.ReadAll(io.LimitReader(r.Body, 4096))
				_ = r.Body.Close()
				refused.Body = strings.TrimSpace(string(body))
			}
		},
	}
	if o.Header != nil {
		d.Header = ws.HandshakeHeaderHTTP(o.Header)
	}
	if o.LocalAddr != nil {
		nd := net.Dialer{LocalAddr: o.LocalAddr, Control: bindNoPort}
		d.NetDial = nd.DialContext
	}
	if o.Compression {
		d.Extensions = []httphead.Option{wsflate.Parameters{ServerNoContextTakeover: true, ClientNoContextTakeover: true}.Option()}
	}
	nc, br, hs, err := d.Dial(ctx, url)
	if err != nil {
		if refused != nil {
			return nil, refused
		}
		return nil, err
	}
	var src io.Reader = nc
	if br != nil {
		src = io.MultiReader(br, nc)
	}
	c := &Conn{nc: nc, br: br}
	c.ctl = wsutil.ControlHandler{Src: nil, Dst: writerFunc(c.writeLocked), State: ws.StateClientSide}
	c.rd = &wsutil.Reader{Source: src, State: ws.StateClientSide, CheckUTF8: true}
	for _, x := range hs.Extensions {
		if o.Compression && bytes.Equal(x.Name, wsflate.ExtensionNameBytes) {
			// A compressed message is checked for UTF-8 once inflated.
			c.deflate = true
			c.rd.State |= ws.StateExtended
			c.rd.Extensions = []wsutil.RecvExtension{&c.msg}
			c.rd.CheckUTF8 = false
		}
	}
	c.ctl.Src = c.rd
	c.rd.OnIntermediate = func(h ws.Header, src io.Reader) error {
		ctl := c.ctl
		ctl.Src = src
		return ctl.Handle(h)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetReadDeadline(dl)
	}
	// A cancelled ctx ends the wait for hello too, not only the handshake.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Unix(1, 0)) })
	m, _, err := c.Read()
	if !stop() && err == nil {
		err = ctx.Err()
	}
	_ = nc.SetReadDeadline(time.Time{})
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if m.Type != protocol.TypeHello {
		_ = nc.Close()
		return nil, fmt.Errorf("first frame is %q, not hello", m.Type)
	}
	c.Hello = m
	return c, nil
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// writeLocked writes control frames for the reader; pongs must not
// interleave with Send.
func (c *Conn) writeLocked(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.writeTimeout > 0 {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	return c.nc.Write(p)
}

// Send writes v as one JSON text message.
func (c *Conn) Send(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.SendRaw(ws.OpText, data)
}

// SendRaw writes one frame with the given op code and payload, masked
// with a new key, in one write: so the frame leaves in one segment, as a
// browser sends it, and the server reads it in one go. payload is not
// changed.
func (c *Conn) SendRaw(op ws.OpCode, payload []byte) error {
	h := ws.Header{Fin: true, OpCode: op, Length: int64(len(payload)), Masked: true, Mask: ws.NewMask()}
	b := bytes.NewBuffer(make([]byte, 0, ws.HeaderSize(h)+len(payload)))
	if err := ws.WriteHeader(b, h); err != nil {
		return err
	}
	n := b.Len()
	b.Write(payload)
	frame := b.Bytes()
	ws.Cipher(frame[n:], h.Mask, 0)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(frame)
	return err
}

// WriteBytes writes bytes as they are, for hand-made frames.
func (c *Conn) WriteBytes(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(b)
	return err
}

// ErrReadingTaken is returned by Read after TakeReading.
var ErrReadingTaken = errors.New("client: the connection is read by its owner (TakeReading)")

// TakeReading is for a caller that reads the socket itself instead of
// calling Read, such as a process holding many connections that learns
// which are readable from epoll rather than keeping a goroutine blocked in
// Read on each. It returns the bytes Dial read past the hello frame, which
// come before anything still in the socket, and releases the reader and
// its buffer. Read must not be called after it (it returns
// ErrReadingTaken); the caller answers pings and close frames itself, with
// SendRaw.
//
// If swap is not nil, the connection is replaced by what swap returns for
// it (the same socket, held another way), for the writes, NetConn, Close
// and Abort. If swap fails, c is left as it was and its error is
// returned. TakeReading must be called before any concurrent use of c.
func (c *Conn) TakeReading(swap func(net.Conn) (net.Conn, error)) ([]byte, error) {
	if c.rd == nil {
		return nil, ErrReadingTaken
	}
	var rest []byte
	if c.br != nil && c.br.Buffered() > 0 {
		b, _ := c.br.Peek(c.br.Buffered())
		rest = append([]byte(nil), b...)
	}
	if swap != nil {
		nc, err := swap(c.nc)
		if err != nil {
			return nil, err
		}
		c.nc = nc
	}
	if c.br != nil {
		ws.PutReader(c.br)
		c.br = nil
	}
	c.rd, c.ctl = nil, wsutil.ControlHandler{}
	return rest, nil
}

// Read returns the next server message, decoded, and its raw JSON. Pings
// are answered on the way. A close frame returns a *CloseError.
func (c *Conn) Read() (protocol.ServerMessage, []byte, error) {
	if c.rd == nil {
		return protocol.ServerMessage{}, nil, ErrReadingTaken
	}
	for {
		h, err := c.rd.NextFrame()
		if err == nil && c.onFrame != nil {
			c.onFrame()
		}
		if err != nil {
			var ce wsutil.ClosedError
			if errors.As(err, &ce) {
				return protocol.ServerMessage{}, nil, &CloseError{Code: ce.Code, Reason: ce.Reason}
			}
			return protocol.ServerMessage{}, nil, err
		}
		if h.OpCode.IsControl() {
			ctl := c.ctl
			if h.OpCode == ws.OpClose {
				// The server may close the socket right after its close
				// frame: a failed answer must not hide the close.
				ctl.Dst = writerFunc(func(p []byte) (int, error) {
					_, _ = c.writeLocked(p)
					return len(p), nil
				})
			}
			if err := ctl.Handle(h); err != nil {
				var ce wsutil.ClosedError
				if errors.As(err, &ce) {
					return protocol.ServerMessage{}, nil, &CloseError{Code: ce.Code, Reason: ce.Reason}
				}
				return protocol.ServerMessage{}, nil, err
			}
			continue
		}
		data, err := c.readMessage()
		if err != nil {
			return protocol.ServerMessage{}, nil, err
		}
		if h.OpCode != ws.OpText {
			return protocol.ServerMessage{}, data, fmt.Errorf("unexpected %v frame", h.OpCode)
		}
		var m protocol.ServerMessage
		if err := json.Unmarshal(data, &m); err != nil {
			return protocol.ServerMessage{}, data, fmt.Errorf("decode %q: %w", data, err)
		}
		return m, data, nil
	}
}

// readMessage reads the message whose first frame Read found, inflated
// if it came compressed.
func (c *Conn) readMessage() ([]byte, error) {
	if !c.deflate {
		return io.ReadAll(c.rd)
	}
	var r io.Reader = c.rd
	if c.msg.IsCompressed() {
		if c.inflater == nil {
			c.inflater = wsflate.NewReader(c.rd, func(r io.Reader) wsflate.Decompressor { return flate.NewReader(r) })
		} else {
			c.inflater.Reset(c.rd)
		}
		r = c.inflater
	}
	data, err := io.ReadAll(r)
	if errors.Is(err, io.ErrUnexpectedEOF) && c.msg.IsCompressed() {
		// A message compressed with a sync flush has no final block: it
		// ends where its frames end.
		err = nil
	}
	if err == nil && !utf8.Valid(data) {
		err = errors.New("text message is not valid UTF-8")
	}
	return data, err
}

// Compressed reports whether permessage-deflate was negotiated.
func (c *Conn) Compressed() bool { return c.deflate }

// SetReadDeadline sets the deadline of Read.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.nc.SetReadDeadline(t) }

// Close sends a normal close frame and closes the connection.
func (c *Conn) Close() error {
	_ = c.SendRaw(ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))
	return c.nc.Close()
}

// Abort closes the TCP connection without a close frame.
func (c *Conn) Abort() error { return c.nc.Close() }

// NetConn returns the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.nc }

// Heartbeat sends a heartbeat message.
func (c *Conn) Heartbeat() error { return c.Send(protocol.ClientMessage{Type: protocol.TypeHeartbeat}) }

// Background sends background, with a grace in milliseconds unless
// graceMS is zero (the gateway's grace then).
func (c *Conn) Background(graceMS int64) error {
	m := protocol.ClientMessage{Type: protocol.TypeBackground}
	if graceMS != 0 {
		m.GraceMS = &graceMS
	}
	return c.Send(m)
}

// SetStatus sends set_status.
func (c *Conn) SetStatus(status string) error {
	return c.Send(protocol.ClientMessage{Type: protocol.TypeSetStatus, Status: status})
}

// SetCustomStatus sends set_custom_status: a text and an emoji shared by
// the user's devices, cleared by the server at expiresAt unless it is
// zero; an empty text and emoji clear it.
func (c *Conn) SetCustomStatus(text, emoji string, expiresAt time.Time) error {
	m := protocol.ClientMessage{Type: protocol.TypeSetCustom, Text: text, Emoji: emoji}
	if !expiresAt.IsZero() {
		m.ExpiresAt = expiresAt.Unix()
	}
	return c.Send(m)
}

// Subscribe sends subscribe with an id the answer echoes.
func (c *Conn) Subscribe(id string, userIDs ...string) error {
	return c.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: id, UserIDs: userIDs})
}
