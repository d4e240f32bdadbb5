package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsflate"
	"github.com/nats-io/nuid"

	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/internal/netpoll"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// WebSocketPath is the path clients upgrade on.
const WebSocketPath = "/ws"

var sniffPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// errRegisterFailed refuses an upgrade whose registration failed (NATS
// slow or away, the lease lost meanwhile).
var errRegisterFailed = fmt.Errorf("%w: presence state is unavailable right now; try again", ErrUnavailable)

// handshake reads the start of a new connection's first request: a GET on
// WebSocketPath is upgraded here, on the raw connection, with
// authentication in the upgrader's callbacks; anything else goes to the
// HTTP server.
func (s *Service) handshake(nc net.Conn, httpLn *chanListener) {
	deadline := time.Now().Add(s.cfg.HandshakeTimeout)
	if err := nc.SetDeadline(deadline); err != nil {
		_ = nc.Close()
		return
	}
	br := sniffPool.Get().(*bufio.Reader)
	br.Reset(nc)
	defer func() {
		br.Reset(nil)
		sniffPool.Put(br)
	}()
	head, err := br.Peek(len("GET " + WebSocketPath + " "))
	if err != nil {
		_ = nc.Close()
		return
	}
	if !isUpgradePath(head) {
		// Hand the connection, and what was read of it, to net/http; its
		// first request keeps the deadline (httpConn).
		buffered, _ := br.Peek(br.Buffered())
		hc := newHTTPConn(nc, bytes.Clone(buffered), deadline)
		if err := nc.SetWriteDeadline(time.Time{}); err != nil || !httpLn.deliver(hc) {
			_ = nc.Close()
		}
		return
	}
	s.upgrade(nc, br)
}

// isUpgradePath reports whether a request starts "GET /ws " or "GET /ws?".
func isUpgradePath(head []byte) bool {
	p := []byte("GET " + WebSocketPath)
	return bytes.HasPrefix(head, p) && len(head) > len(p) && (head[len(p)] == ' ' || head[len(p)] == '?')
}

// upgrade answers a WebSocket upgrade request: it authenticates the client
// from the request, registers the connection in NATS, and only then
// answers 101; a refusal is a plain HTTP answer.
func (s *Service) upgrade(nc net.Conn, br *bufio.Reader) {
	var (
		cr        credentials
		c         *conn
		status    presence.Record
		statusRev uint64
		refused   bool // counted by refuse
		head      = newUpgradeHead(br)
		deflate   wsflate.Extension
	)
	cr.askProxy = s.proxy != nil
	refuse := func(err error) error {
		refused = true
		s.metrics.upgrades.WithLabelValues(errorCode(err)).Inc()
		if s.log.Enabled(context.Background(), levelDebug) {
			s.log.LogAttrs(context.Background(), levelDebug, "upgrade refused", attrErr(err))
		}
		return ws.RejectConnectionError(ws.RejectionStatus(httpStatus(err)), ws.RejectionReason(err.Error()+"\n"))
	}
	u := ws.Upgrader{
		OnRequest: func(uri []byte) error {
			_, rawQuery, _ := bytes.Cut(uri, []byte("?"))
			if err := cr.parseQuery(string(rawQuery)); err != nil {
				return refuse(err)
			}
			return nil
		},
		OnHeader: func(key, value []byte) error {
			cr.setHeader(string(key), string(value))
			if cr.askProxy {
				s.proxy.forward(&cr, key, value)
			}
			return nil
		},
		OnBeforeUpgrade: func() (ws.HandshakeHeader, error) {
			if err := head.check(); err != nil {
				return nil, refuse(err)
			}
			if err := s.checkOrigin(&cr); err != nil {
				return nil, refuse(err)
			}
			id, err := s.authenticate(&cr)
			if err != nil {
				return nil, refuse(err)
			}
			if s.draining.Load() {
				return nil, refuse(fmt.Errorf("%w: the gateway is draining; reconnect elsewhere", ErrUnavailable))
			}
			if err := s.keys.ready(); err != nil {
				return nil, refuse(err)
			}
			if id.proxied {
				if err := s.askProxy(&cr, &id); err != nil {
					return nil, refuse(err)
				}
			}
			if err := s.registry.reserve(id.userID, s.cfg.MaxConns); err != nil {
				return nil, refuse(err)
			}
			select {
			case s.regSem <- struct{}{}:
			default:
				s.registry.release(id.userID)
				return nil, refuse(fmt.Errorf("%w: too many connections being registered; retry shortly", ErrUnavailable))
			}
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HandshakeTimeout)
			defer cancel()
			cc := s.newConn(id)
			status, statusRev, err = s.keys.register(ctx, cc)
			<-s.regSem
			if err != nil {
				s.registry.release(id.userID)
				s.log.Warn("register connection", "user_id", id.userID, "err", err)
				// What failed is the operator's to read, in the log: the
				// client learns only that it may try again.
				return nil, refuse(errRegisterFailed)
			}
			c = cc
			return nil, nil
		},
	}
	if !s.cfg.NoCompression {
		u.Negotiate = negotiateDeflate(&deflate)
	}
	if s.cfg.DevAuth {
		u.OnHost = func(host []byte) error {
			if err := s.checkHost(string(host)); err != nil {
				return refuse(err)
			}
			return nil
		}
	}
	// The answer is kept, not written: a 101 goes out with hello and the
	// user's own state, in one write (start); a refusal is written here.
	answer := answerPool.Get().(*bytes.Buffer)
	answer.Reset()
	defer func() {
		if answer.Cap() <= 4<<10 {
			answerPool.Put(answer)
		}
	}()
	_, err := u.Upgrade(struct {
		io.Reader
		io.Writer
	}{head, answer})
	if err != nil && answer.Len() > 0 {
		_, _ = nc.Write(answer.Bytes())
	}
	var rejected *ws.ConnectionRejectedError
	switch {
	case errors.Is(err, errHeadTooLarge):
		s.metrics.upgrades.WithLabelValues("too_large").Inc()
		_, _ = io.WriteString(nc, "HTTP/1.1 431 Request Header Fields Too Large\r\n"+
			"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"+
			errHeadTooLarge.Error()+"\n")
	case !refused && errors.As(err, &rejected):
		// Refused by the library: a request that breaks RFC 6455 (no
		// Upgrade header, as from a proxy that drops it; another
		// version; a bad key).
		s.metrics.upgrades.WithLabelValues("bad_request").Inc()
	}
	if err == nil && br.Buffered() > 0 {
		err = errors.New("data sent before the upgrade was answered")
	}
	if err == nil {
		err = nc.SetDeadline(time.Time{})
	}
	if err != nil {
		if c != nil {
			// Registered, but the client is gone or misbehaved.
			s.registry.release(c.userID)
			c.closed.Store(true)
			s.keys.end(c, c.since)
		}
		_ = nc.Close()
		return
	}
	if cr.proxied {
		s.proxy.track(c, cr.session, cr.lifetime, time.Unix(0, c.expires.Load()))
	}
	s.metrics.upgrades.WithLabelValues("accepted").Inc()
	_, compressed := deflate.Accepted()
	if compressed {
		s.metrics.compressed.Inc()
	}
	if hook := s.hooks.afterRegister.Load(); hook != nil {
		(*hook)(c.userID)
	}
	s.start(c, nc, selfState{rev: statusRev, status: status.Status, devices: status.Devices, custom: status.Custom}, answer.Bytes(), compressed)
}

// answerPool holds the buffers upgrade keeps its answers in.
var answerPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// newConn returns a connection of a verified client, not yet registered.
func (s *Service) newConn(id identity) *conn {
	now := time.Now()
	c := &conn{
		env:    s.env,
		connID: nuid.Next(),
		userID: id.userID,
		device: id.device,
		since:  now.UnixMilli(),
		key:    connKey{platform: id.platform},
	}
	c.lastFrame.Store(now.UnixNano())
	c.lastActivity.Store(now.UnixNano())
	if !id.expires.IsZero() {
		c.expires.Store(id.expires.UnixNano())
	}
	c.watch.Store(id.watch)
	c.roomGrant.Store(id.rooms)
	return c
}

// start runs a registered, upgraded connection: it indexes it, writes
// the answer to its upgrade, hello and the user's own state in one write,
// and hands the socket to the poller. reg is the user's own state its
// registration wrote; deflate says permessage-deflate was negotiated.
func (s *Service) start(c *conn, nc net.Conn, reg selfState, answer []byte, deflate bool) {
	// The TTL counts from hello, not from the start of registration: a
	// slow upgrade must not eat into the client's first heartbeat interval.
	c.lastFrame.Store(nowNano())
	if s.sockets.polled() {
		// The gateway's poller watches the socket, so it needs nothing of
		// the runtime's: held by its descriptor alone it costs about 900
		// bytes less. Should that fail, the socket stays as it is.
		if dc, err := netpoll.Detach(nc); err == nil {
			nc = dc
		} else if s.log.Enabled(context.Background(), levelDebug) {
			s.log.LogAttrs(context.Background(), levelDebug, "socket kept in the runtime poller", attrErr(err))
		}
	}
	c.sock = socket.New(nc, s.cfg.WriteTimeout)
	if deflate {
		c.sock.Deflate()
	}
	// Hold the socket until hello is written: the scheduler must not
	// write first.
	c.sock.Lock()
	c.sock.CorkLocked(answer)
	if err := s.registry.add(c); err != nil {
		c.wrote(c.sock.UncorkLocked())
		c.sock.Unlock()
		s.end(c, endClean, ws.StatusPolicyViolation, err.Error())
		return
	}
	s.due.at(c, s.nextLook(c, nowNano(), false))
	// The newest own state known, not only the registration's: another
	// device's change written meanwhile may have gone by (listed).
	self := s.keys.listed(c, reg)
	// The user's own state goes right after hello, before any answer to
	// what the client sends once it has hello: written here, under the
	// same hold, not left to the scheduler. (A box handed to the
	// scheduler meanwhile, by another device's change, is taken here
	// too, and the scheduler then finds it empty.)
	c.box.AddSelf(self.rev, self.status, self.devices, self.custom)
	s.members.status(c, self.rev, self.status)
	hello := protocol.Hello{
		Type:                protocol.TypeHello,
		UserID:              c.userID,
		ConnID:              c.connID,
		HeartbeatIntervalMS: s.cfg.HeartbeatInterval.Milliseconds(),
		TTLMS:               s.cfg.ConnTTL.Milliseconds(),
		Status:              self.status,
	}
	err := s.sendLocked(c, protocol.TypeHello, &hello)
	if err == nil {
		c.flushLocked(nil)
	}
	if !c.wrote(c.sock.UncorkLocked()) && err == nil {
		err = errWriteFailed
	}
	c.sock.Unlock()
	if err != nil || c.closed.Load() {
		return
	}
	if s.log.Enabled(context.Background(), levelDebug) {
		s.log.LogAttrs(context.Background(), levelDebug, "connection opened", attrUser(c.userID), attrConn(c.connID))
	}
	s.sockets.watch(c)
}

// maxRequestHead bounds the request line and headers of an upgrade
// request, as net/http's MaxHeaderBytes does for the HTTP API: gobwas/ws
// reads a header line of any length into memory.
const maxRequestHead = 32 << 10

// errHeadTooLarge refuses an upgrade request whose head is over
// maxRequestHead bytes.
var errHeadTooLarge = fmt.Errorf("request line and headers over %d bytes", maxRequestHead)

// headLimiter reads at most n bytes from r, then fails with
// errHeadTooLarge.
type headLimiter struct {
	r io.Reader
	n int
}

func (l *headLimiter) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeadTooLarge
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}

// chanListener is a net.Listener fed by the gateway's own accept loop, for
// the HTTP server.
type chanListener struct {
	addr   net.Addr
	ch     chan net.Conn
	done   chan struct{}
	closer sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

// deliver hands c to the HTTP server; it reports false once the listener is
// closed.
func (l *chanListener) deliver(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.closer.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }
