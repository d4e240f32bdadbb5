package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/testlog"
	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
	"github.com/greendot/greendot/web"
)

// The tests of this file, limits_test.go and privacy_test.go run gateways
// that take only JWTs (dev auth off), verified by pkg/auth with the HMAC
// secret below; every token is signed here, in the test.

// secSecret is the HS256 secret of the test tokens.
var secSecret = []byte("greendot security tests: a secret of 32+ bytes")

// secVerifier returns the verifier the gateways under test use.
func secVerifier(tb testing.TB) gateway.TokenVerifier {
	tb.Helper()
	v, err := auth.New(auth.Config{Secret: secSecret})
	if err != nil {
		tb.Fatalf("verifier: %v", err)
	}
	return v
}

// secSign signs claims with method and key.
func secSign(tb testing.TB, method jwt.SigningMethod, key any, claims jwt.Claims) string {
	tb.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		tb.Fatalf("sign token: %v", err)
	}
	return s
}

// secToken returns a valid token for sub that expires at exp.
func secToken(tb testing.TB, sub string, exp time.Time) string {
	tb.Helper()
	return secSign(tb, jwt.SigningMethodHS256, secSecret, jwt.RegisteredClaims{
		Subject:   sub,
		ExpiresAt: jwt.NewNumericDate(exp),
	})
}

// secLongToken returns a valid token for sub that outlives the test.
func secLongToken(tb testing.TB, sub string) string {
	tb.Helper()
	return secToken(tb, sub, time.Now().Add(time.Hour))
}

// secStart runs a system whose gateways take tokens only.
func secStart(tb testing.TB, opts systest.Options) *systest.System {
	tb.Helper()
	if opts.Gateway.Tokens == nil {
		opts.Gateway.Tokens = secVerifier(tb)
	}
	return systest.Start(tb, opts)
}

// bearer returns an Authorization header carrying token.
func bearer(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

// secDialErr dials url with the headers h.
func secDialErr(url string, h http.Header) (*client.Conn, error) {
	return client.Dial(context.Background(), url, client.Options{Header: h, Timeout: 5 * time.Second})
}

// secDial connects user to g with a token in the Authorization header, and
// an optional device label. The socket is aborted when the test ends.
func secDial(tb testing.TB, g *systest.Gateway, user string, device ...string) *client.Conn {
	tb.Helper()
	u := g.WS
	if len(device) > 0 {
		u += "?device=" + url.QueryEscape(device[0])
	}
	c, err := secDialErr(u, bearer(secLongToken(tb, user)))
	if err != nil {
		tb.Fatalf("dial %s as %s: %v", g.Addr, user, err)
	}
	tb.Cleanup(func() { _ = c.Abort() })
	if c.Hello.UserID != user {
		tb.Fatalf("hello for %q, want %q", c.Hello.UserID, user)
	}
	return c
}

// refusedWith asserts that a dial was refused with an HTTP status, and
// returns the body of the refusal.
func refusedWith(tb testing.TB, err error, status int) string {
	tb.Helper()
	var he *client.HandshakeError
	if !errors.As(err, &he) {
		tb.Fatalf("dial: %v, want a refusal with HTTP %d", err, status)
	}
	if he.Status != status {
		tb.Fatalf("dial refused with HTTP %d (%s), want %d", he.Status, he.Body, status)
	}
	return he.Body
}

// awaitClose reads c until the gateway closes it with a close frame, and
// returns the close code. Frames before it are discarded. It fails the
// test if the socket is not closed within timeout, or ends without a close
// frame.
func awaitClose(tb testing.TB, c *client.Conn, timeout time.Duration) (ws.StatusCode, []protocol.ServerMessage) {
	tb.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	var seen []protocol.ServerMessage
	for range 100_000 {
		m, raw, err := c.Read()
		if err == nil {
			seen = append(seen, m)
			continue
		}
		var ce *client.CloseError
		if errors.As(err, &ce) {
			return ce.Code, seen
		}
		tb.Fatalf("waiting for a close frame: %v (%s); seen %+v", err, raw, seen)
	}
	tb.Fatalf("no close frame in 100000 frames")
	return 0, nil
}

// awaitGone reads c until its connection ends, with or without a close
// frame, failing the test if it is still open after timeout.
func awaitGone(tb testing.TB, c *client.Conn, timeout time.Duration) error {
	tb.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	for range 100_000 {
		_, _, err := c.Read()
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			tb.Fatalf("connection still open after %v", timeout)
		}
		return err
	}
	tb.Fatalf("connection still sending after 100000 frames")
	return nil
}

// stillOpen reads c until deadline and fails the test if the connection
// ends meanwhile. Frames read are returned.
func stillOpen(tb testing.TB, c *client.Conn, until time.Time) []protocol.ServerMessage {
	tb.Helper()
	_ = c.SetReadDeadline(until)
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	var seen []protocol.ServerMessage
	for range 100_000 {
		m, raw, err := c.Read()
		if err == nil {
			seen = append(seen, m)
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return seen
		}
		tb.Fatalf("connection ended: %v (%s); want it open", err, raw)
	}
	return seen
}

// subscribeSelf subscribes c to its own user and waits for the answer: a
// round trip that proves the socket is open and served.
func subscribeSelf(tb testing.TB, c *client.Conn, id string) protocol.ServerMessage {
	tb.Helper()
	if err := c.Subscribe(id, c.Hello.UserID); err != nil {
		tb.Fatalf("subscribe: %v", err)
	}
	return systest.Await(tb, c, systest.EventTimeout, "presence_init "+id, func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == id
	})
}

// apiCall makes an HTTP request with headers h and body (JSON of it, or
// the bytes as they are), and decodes a JSON answer into out (when not
// nil). It returns the status code.
func apiCall(tb testing.TB, method, url string, h http.Header, body any, out any) int {
	tb.Helper()
	st, _ := apiCallHeader(tb, method, url, h, body, out)
	return st
}

// apiCallHeader is apiCall that also returns the answer's headers.
func apiCallHeader(tb testing.TB, method, url string, h http.Header, body any, out any) (int, http.Header) {
	tb.Helper()
	var rd io.Reader
	if raw, ok := body.([]byte); ok {
		rd = bytes.NewReader(raw)
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			tb.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read body: %v", method, url, err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusNoContent && !strings.HasPrefix(ct, "application/json") {
		tb.Errorf("%s %s: %d with content type %q, want JSON: %s", method, url, resp.StatusCode, ct, data)
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			tb.Fatalf("%s %s: %d %s: %v", method, url, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode, resp.Header
}

// apiErr is the body of an HTTP API error.
type apiErr struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// bystander is a pair of users, both on a gateway under test, watching each
// other: after a hostile client did its worst, check proves that their
// presence and subscriptions are intact.
type bystander struct {
	sys            *systest.System
	subject, watch *client.Conn
	subjectID, wID string
	busy           bool
	stopA, stopB   func()
}

// newBystander connects two mutual followers to g, the watcher subscribed
// to the subject.
func newBystander(tb testing.TB, sys *systest.System, g *systest.Gateway) *bystander {
	tb.Helper()
	b := &bystander{sys: sys, subjectID: "bystander", wID: "bystander-watcher"}
	sys.Mutual(b.subjectID, b.wID)
	b.watch = secDial(tb, g, b.wID)
	b.stopB = systest.KeepAlive(b.watch, systest.Heartbeat)
	if err := b.watch.Subscribe("by", b.subjectID); err != nil {
		tb.Fatal(err)
	}
	systest.Await(tb, b.watch, systest.EventTimeout, "bystander presence_init", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "by"
	})
	b.subject = secDial(tb, g, b.subjectID)
	b.stopA = systest.KeepAlive(b.subject, systest.Heartbeat)
	systest.AwaitStatus(tb, b.watch, b.subjectID, presence.Online)
	tb.Cleanup(func() { b.stopA(); b.stopB() })
	return b
}

// check changes the subject's status and asserts the watcher sees it, the
// subject's own devices see it, and the status record holds exactly the
// subject's one live connection.
func (b *bystander) check(tb testing.TB) {
	tb.Helper()
	b.busy = !b.busy
	want, chosen := presence.Online, "online"
	if b.busy {
		want, chosen = presence.Busy, "busy"
	}
	if err := b.subject.SetStatus(chosen); err != nil {
		tb.Fatalf("bystander set_status: %v", err)
	}
	systest.AwaitStatus(tb, b.watch, b.subjectID, want)
	systest.AwaitSelf(tb, b.subject, want, 1)
	rec, err := b.sys.StatusOf(b.subjectID)
	if err != nil {
		tb.Fatal(err)
	}
	if rec.Status != want || rec.Devices != 1 || len(rec.Conns) != 1 {
		tb.Fatalf("bystander record = %+v, want %s with one connection", rec, want)
	}
	if _, ok := rec.Conns[b.subject.Hello.ConnID]; !ok {
		tb.Fatalf("bystander record lost its connection %s: %+v", b.subject.Hello.ConnID, rec.Conns)
	}
}

func TestUpgradeAuth(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	now := time.Now()
	other := []byte("another secret, not the gateway's one")
	tests := []struct {
		name   string
		query  string
		header http.Header
		status int // 0: accepted
	}{
		{"no identity", "", nil, http.StatusUnauthorized},
		{"empty bearer", "", http.Header{"Authorization": {"Bearer "}}, http.StatusUnauthorized},
		{"basic auth", "", http.Header{"Authorization": {"Basic YWxpY2U6cHc="}}, http.StatusUnauthorized},
		{"garbage token", "", bearer("not.a.jwt"), http.StatusUnauthorized},
		{"expired token", "", bearer(secToken(t, "alice", now.Add(-time.Minute))), http.StatusUnauthorized},
		{"wrong signature", "", bearer(secSign(t, jwt.SigningMethodHS256, other, jwt.RegisteredClaims{
			Subject: "alice", ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)),
		})), http.StatusUnauthorized},
		{"alg none", "", bearer(secSign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwt.RegisteredClaims{
			Subject: "alice", ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)),
		})), http.StatusUnauthorized},
		{"no exp", "", bearer(secSign(t, jwt.SigningMethodHS256, secSecret, jwt.RegisteredClaims{Subject: "alice"})), http.StatusUnauthorized},
		{"no sub", "", bearer(secSign(t, jwt.SigningMethodHS256, secSecret, jwt.RegisteredClaims{
			ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)),
		})), http.StatusUnauthorized},
		{"sub not a user id", "", bearer(secToken(t, "al.ice", now.Add(time.Hour))), http.StatusUnauthorized},
		{"not yet valid", "", bearer(secSign(t, jwt.SigningMethodHS256, secSecret, jwt.RegisteredClaims{
			Subject: "alice", ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)), NotBefore: jwt.NewNumericDate(now.Add(30 * time.Minute)),
		})), http.StatusUnauthorized},
		{"expired token in query", "?token=" + secToken(t, "alice", now.Add(-time.Minute)), nil, http.StatusUnauthorized},
		{"dev auth user while off", "?user=alice", nil, http.StatusUnauthorized},
		{"bad header is not rescued by the query", "?token=" + secLongToken(t, "alice"), bearer("bad"), http.StatusUnauthorized},
		{"bad device", "?device=" + strings.Repeat("d", 33), bearer(secLongToken(t, "alice")), http.StatusBadRequest},
		{"device with a slash", "?device=a%2Fb", bearer(secLongToken(t, "alice")), http.StatusBadRequest},
		{"token in header", "", bearer(secLongToken(t, "alice")), 0},
		{"token in query", "?device=web&token=" + secLongToken(t, "alice"), nil, 0},
		{"lower-case bearer scheme", "", http.Header{"Authorization": {"bearer " + secLongToken(t, "alice")}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := secDialErr(gw.WS+tt.query, tt.header)
			if tt.status != 0 {
				if body := refusedWith(t, err, tt.status); strings.TrimSpace(body) == "" {
					t.Errorf("refusal without a reason")
				}
				return
			}
			if err != nil {
				t.Fatalf("dial: %v, want accepted", err)
			}
			defer c.Abort()
			if c.Hello.UserID != "alice" {
				t.Errorf("hello = %+v, want alice", c.Hello)
			}
		})
	}
	by.check(t)

	// A bad user id with dev auth on is a bad request, not an
	// authentication failure.
	dev := sys.StartGateway(gateway.Config{DevAuth: true})
	for _, q := range []string{"?user=al%20ice", "?user=" + strings.Repeat("a", 65), "?user=a.b", "?user=a*"} {
		_, err := secDialErr(dev.WS+q, nil)
		refusedWith(t, err, http.StatusBadRequest)
	}
	_, err := secDialErr(dev.WS, nil)
	refusedWith(t, err, http.StatusUnauthorized)
	by.check(t)
}

// rawUpgrade sends an upgrade request by hand on a raw connection and
// returns the status line of the answer.
func rawUpgrade(tb testing.TB, addr, target string, extra ...string) string {
	tb.Helper()
	return rawUpgradeTo(tb, addr, addr, target, extra...)
}

// rawUpgradeTo is rawUpgrade with the Host header host.
func rawUpgradeTo(tb testing.TB, addr, host, target string, extra ...string) string {
	tb.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	for _, h := range extra {
		req += h + "\r\n"
	}
	if _, err := io.WriteString(nc, req+"\r\n"); err != nil {
		tb.Fatal(err)
	}
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil {
		tb.Fatalf("read answer: %v", err)
	}
	return strings.TrimSpace(line)
}

func TestUpgradeRefusalIsPlainHTTP(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	if line := rawUpgrade(t, gw.Addr, "/ws"); !strings.HasPrefix(line, "HTTP/1.1 401") {
		t.Errorf("no identity: %q, want HTTP/1.1 401", line)
	}
	if line := rawUpgrade(t, gw.Addr, "/ws?user=alice"); !strings.HasPrefix(line, "HTTP/1.1 401") {
		t.Errorf("?user= with dev auth off: %q, want HTTP/1.1 401", line)
	}
	if line := rawUpgrade(t, gw.Addr, "/ws?token=%zz"); !strings.HasPrefix(line, "HTTP/1.1 400") {
		t.Errorf("malformed query: %q, want HTTP/1.1 400", line)
	}
	if line := rawUpgrade(t, gw.Addr, "/ws", "Authorization: Bearer "+secLongToken(t, "alice")); !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Errorf("good token: %q, want HTTP/1.1 101", line)
	}
	// Nothing was registered for the refused requests: only the accepted
	// one (closed by the raw client at once) ever reached presence_conns.
	rec, err := sys.StatusOf("alice")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Conns) > 1 {
		t.Errorf("alice's record holds %d connections, want at most the accepted one: %+v", len(rec.Conns), rec.Conns)
	}
}

// TestMalformedUpgradeCounted: an upgrade request that breaks RFC 6455 (a
// proxy that drops the Upgrade header, an old protocol version, a
// Sec-WebSocket-Key that is not the base64 of 16 bytes, or two of them)
// is refused with 400 (426 for the version), before anything is
// registered, and counted as a refusal, so that an operator sees why
// clients cannot connect.
func TestMalformedUpgradeCounted(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	refused := func() float64 {
		return metricValue(t, gw, "greendot_gateway_upgrades_total", map[string]string{"result": "bad_request"})
	}
	auth := "Authorization: Bearer " + secLongToken(t, "alice")
	tests := []struct {
		name   string
		req    string
		status string
	}{
		{"no Upgrade header", "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + auth + "\r\n\r\n", "400"},
		{"version 8", "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n" + auth + "\r\n\r\n", "426"},
		{"short key", "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: c2hvcnQ=\r\nSec-WebSocket-Version: 13\r\n" + auth + "\r\n\r\n", "400"},
		// 24 characters, as gobwas/ws checks, but not base64.
		{"key not base64", "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: !!!!!!!!!!!!!!!!!!!!!!==\r\nSec-WebSocket-Version: 13\r\n" + auth + "\r\n\r\n", "400"},
		{"key the base64 of 17 bytes", "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZSE=\r\nSec-WebSocket-Version: 13\r\n" + auth + "\r\n\r\n", "400"},
		{"two keys", "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-key: AAAAAAAAAAAAAAAAAAAAAA==\r\n" +
			"Sec-WebSocket-Version: 13\r\n" + auth + "\r\n\r\n", "400"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := refused()
			nc, err := net.DialTimeout("tcp", gw.Addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(nc, tt.req); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(nc).ReadString('\n')
			if err != nil {
				t.Fatalf("read answer: %v", err)
			}
			if !strings.HasPrefix(line, "HTTP/1.1 "+tt.status) {
				t.Fatalf("answer %q, want %s", strings.TrimSpace(line), tt.status)
			}
			// The answer is written before it is counted.
			natstest.CheckFor(t, systest.EventTimeout, 5*time.Millisecond, func() error {
				if got := refused(); got != before+1 {
					return fmt.Errorf("upgrades refused as bad_request: %v, want %v", got, before+1)
				}
				return nil
			})
		})
	}
}

func TestUpgradeHeadIsBounded(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	auth := "Authorization: Bearer " + secLongToken(t, "alice")
	many := make([]string, 0, 3001)
	for range 3000 {
		many = append(many, "X-Many: 0123456789")
	}
	tests := []struct {
		name   string
		target string
		extra  []string
		status string
	}{
		{"large header within the bound", "/ws", []string{"X-Pad: " + strings.Repeat("a", 20<<10), auth}, "101"},
		{"header line over the bound", "/ws", []string{"X-Pad: " + strings.Repeat("a", 40<<10), auth}, "431"},
		{"request line over the bound", "/ws?pad=" + strings.Repeat("a", 40<<10), []string{auth}, "431"},
		{"many headers over the bound", "/ws", append(many, auth), "431"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if line := rawUpgrade(t, gw.Addr, tt.target, tt.extra...); !strings.HasPrefix(line, "HTTP/1.1 "+tt.status) {
				t.Errorf("answer %q, want %s", line, tt.status)
			}
		})
	}

	// A header line that never ends: the gateway stops reading it at the
	// bound instead of holding all of it.
	nc, err := net.Dial("tcp", gw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	go func() {
		_, _ = io.WriteString(nc, "GET /ws HTTP/1.1\r\nHost: x\r\nX-Endless: ")
		chunk := bytes.Repeat([]byte("a"), 64<<10)
		for range 1600 { // 100 MiB, if it were all read
			_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := nc.Write(chunk); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	_ = nc.SetReadDeadline(start.Add(10 * time.Second))
	answer, err := io.ReadAll(nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("endless header still read after %v", time.Since(start))
	}
	// The gateway answers 431 and closes; the bytes it never read may turn
	// its close into a reset that discards the answer.
	if len(answer) > 0 && !bytes.HasPrefix(answer, []byte("HTTP/1.1 431")) {
		t.Errorf("endless header answered %q", answer)
	}
	by.check(t)
}

func TestOriginCheck(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{AllowedOrigins: []string{"https://app.example.com"}}})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	tok := secLongToken(t, "alice")
	tests := []struct {
		name   string
		origin string
		status int
	}{
		{"allowed origin", "https://app.example.com", 0},
		{"allowed origin, other case", "https://APP.example.com", 0},
		{"no origin (not a browser)", "", 0},
		{"other site", "https://evil.example", http.StatusForbidden},
		{"allowed host over http", "http://app.example.com", http.StatusForbidden},
		{"suffix trick", "https://app.example.com.evil.example", http.StatusForbidden},
		{"null origin", "null", http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := bearer(tok)
			if tt.origin != "" {
				h.Set("Origin", tt.origin)
			}
			c, err := secDialErr(gw.WS, h)
			if tt.status != 0 {
				refusedWith(t, err, tt.status)
			} else if err != nil {
				t.Fatalf("dial: %v, want accepted", err)
			} else {
				_ = c.Abort()
			}
			// The same rule on the HTTP API, with CORS headers only for
			// allowed origins.
			var e apiErr
			st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/alice", h, nil, &e)
			want := http.StatusOK
			if tt.status != 0 {
				want = tt.status
			}
			if st != want {
				t.Errorf("GET /api/presence/users/alice: %d %+v, want %d", st, e, want)
			}
			if st == http.StatusForbidden && e.Error != "forbidden_origin" {
				t.Errorf("refused origin: error %q, want forbidden_origin", e.Error)
			}
			if tt.origin == "" {
				return
			}
			req, _ := http.NewRequest("OPTIONS", gw.HTTP+"/api/presence/query", nil)
			req.Header.Set("Origin", tt.origin)
			req.Header.Set("Access-Control-Request-Method", "POST")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			acao := resp.Header.Get("Access-Control-Allow-Origin")
			if tt.status == 0 && (resp.StatusCode != http.StatusNoContent || acao != tt.origin) {
				t.Errorf("preflight: %d, allow-origin %q; want 204 allowing %q", resp.StatusCode, acao, tt.origin)
			}
			if tt.status != 0 && (resp.StatusCode != http.StatusForbidden || acao != "") {
				t.Errorf("preflight from a refused origin: %d, allow-origin %q; want 403 and none", resp.StatusCode, acao)
			}
		})
	}
	by.check(t)
}

// TestDuplicateOriginRefused: a request with two Origin headers is refused
// with 400, an upgrade as an API request, whichever of them is allowed and
// whether origins are checked at all: one rule, where the upgrade read the
// last and the API the first.
func TestDuplicateOriginRefused(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{AllowedOrigins: []string{"https://app.example.com"}}})
	by := newBystander(t, sys, sys.Gateway())
	anyOrigin := sys.StartGateway(gateway.Config{})
	tok := secLongToken(t, "alice")
	for _, gw := range []*systest.Gateway{sys.Gateway(), anyOrigin} {
		for _, origins := range [][]string{
			{"https://app.example.com", "https://evil.example"},
			{"https://evil.example", "https://app.example.com"},
			{"https://app.example.com", "https://app.example.com"},
		} {
			name := fmt.Sprintf("origins %v: %s", gw.Config().AllowedOrigins, strings.Join(origins, " then "))
			t.Run(name, func(t *testing.T) {
				extra := []string{"Authorization: Bearer " + tok}
				for _, o := range origins {
					extra = append(extra, "Origin: "+o)
				}
				if line := rawUpgrade(t, gw.Addr, "/ws", extra...); !strings.HasPrefix(line, "HTTP/1.1 400") {
					t.Errorf("upgrade: %q, want HTTP/1.1 400", line)
				}
				h := bearer(tok)
				h["Origin"] = origins
				var e apiErr
				st, hdr := apiCallHeader(t, "GET", gw.HTTP+"/api/presence/users/alice", h, nil, &e)
				if st != http.StatusBadRequest || e.Error != "bad_request" || e.Message == "" {
					t.Errorf("GET /api/presence/users/alice: %d %+v, want 400 bad_request", st, e)
				}
				if acao := hdr.Get("Access-Control-Allow-Origin"); acao != "" {
					t.Errorf("CORS header for a request with two origins: %q", acao)
				}
			})
		}
	}
	rec, err := sys.StatusOf("alice")
	if err != nil || len(rec.Conns) != 0 {
		t.Errorf("alice registered: %+v %v", rec, err)
	}
	by.check(t)
}

// TestDevAuthAnswersOnlyThisMachine: under dev auth, a request that names
// (Host) a host this machine is not known by is refused with 403
// forbidden_host, the upgrade, the API and the demo's graph writes alike:
// a web page whose name its site made point to this machine (DNS
// rebinding: Host and Origin both the page's) must not act as any user.
// localhost, names under .localhost, IP addresses and --dev-auth-hosts are
// answered.
func TestDevAuthAnswersOnlyThisMachine(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	by := newBystander(t, sys, sys.Gateway())
	dev := sys.StartGateway(gateway.Config{
		DevAuth:      true,
		DevAuthHosts: []string{"dev.example"},
		Static:       web.Handler(web.Options{Demo: true, Store: sys.Store, Logger: testlog.New(t)}),
	})
	_, port, err := net.SplitHostPort(dev.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// call makes a request as a page at host would.
	call := func(t *testing.T, method, path, host string, body string) (int, apiErr) {
		t.Helper()
		req, err := http.NewRequest(method, dev.HTTP+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Origin", "http://"+host)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e apiErr
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	for _, tt := range []struct {
		host string
		ok   bool
	}{
		{"rebind.example:" + port, false},
		{"rebind.example", false},
		{"localhost.rebind.example:" + port, false},
		{"localhost.:" + port, false},
		{"127.0.0.1:" + port, true},
		{"localhost:" + port, true},
		{"app.localhost:" + port, true},
		{"[::1]:" + port, true},
		{"192.0.2.7:" + port, true},
		{"DEV.example:" + port, true},
	} {
		t.Run(tt.host, func(t *testing.T) {
			wantStatus, wantLine, wantEdge := http.StatusForbidden, "HTTP/1.1 403", false
			if tt.ok {
				wantStatus, wantLine, wantEdge = http.StatusOK, "HTTP/1.1 101", true
			}
			line := rawUpgradeTo(t, dev.Addr, tt.host, "/ws?user=mallory", "Origin: http://"+tt.host)
			if !strings.HasPrefix(line, wantLine) {
				t.Errorf("upgrade: %q, want %s", line, wantLine)
			}
			st, e := call(t, "GET", "/api/presence/users/mallory?user=mallory", tt.host, "")
			if st != wantStatus || !tt.ok && e.Error != "forbidden_host" {
				t.Errorf("GET /api/presence/users/mallory: %d %+v, want %d", st, e, wantStatus)
			}
			st, e = call(t, "POST", "/demo/api/follow?user=mallory", tt.host, `{"user_id":"victim"}`)
			if tt.ok && st != http.StatusNoContent || !tt.ok && (st != http.StatusForbidden || e.Error != "forbidden_host") {
				t.Errorf("POST /demo/api/follow: %d %+v", st, e)
			}
			follows, err := sys.Store.Follows(context.Background(), "mallory", "victim")
			if err != nil {
				t.Fatal(err)
			}
			if follows != wantEdge {
				t.Errorf("mallory follows victim: %v, want %v", follows, wantEdge)
			}
			if err := sys.Store.Unfollow(context.Background(), "mallory", "victim"); err != nil {
				t.Fatal(err)
			}
		})
	}
	by.check(t)
}

func TestGatewayFullAndConnsPerUser(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.StartGateway(gateway.Config{MaxConns: 3, MaxConnsPerUser: 2})
	by := newBystander(t, sys, sys.Gateway())

	// Per user: the third socket of alice is refused, bob still gets in.
	a1 := secDial(t, gw, "alice")
	a2 := secDial(t, gw, "alice", "phone")
	_, err := secDialErr(gw.WS, bearer(secLongToken(t, "alice")))
	if body := refusedWith(t, err, http.StatusTooManyRequests); !strings.Contains(body, "at most 2") {
		t.Errorf("refusal %q does not say the limit", body)
	}
	b1 := secDial(t, gw, "bob")
	// The gateway is full: anyone is refused with 503.
	_, err = secDialErr(gw.WS, bearer(secLongToken(t, "carol")))
	refusedWith(t, err, http.StatusServiceUnavailable)
	if gw.Conns() != 3 {
		t.Errorf("gateway holds %d connections, want 3", gw.Conns())
	}
	// Room again once a socket closes.
	if err := a2.Close(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		c, err := secDialErr(gw.WS, bearer(secLongToken(t, "carol")))
		if err != nil {
			return err
		}
		t.Cleanup(func() { _ = c.Abort() })
		return nil
	})
	_, _ = a1, b1
	by.check(t)
}

// TestLimitsCountConnectionsBeingRegistered: an upgrade being registered
// holds its place under --max-conns and --max-conns-per-user, so one that
// comes meanwhile is refused before its upgrade (503 or 429), not let in
// past the limit or answered 101 and then closed.
func TestLimitsCountConnectionsBeingRegistered(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.StartGateway(gateway.Config{MaxConns: 2, MaxConnsPerUser: 1})
	// alice's first socket waits once registered, not yet counted by the
	// gateway's registry.
	registered, release := gw.PauseAfterRegister(t, "alice")
	first := make(chan error, 1)
	go func() {
		c, err := secDialErr(gw.WS, bearer(secLongToken(t, "alice")))
		if err == nil {
			t.Cleanup(func() { _ = c.Abort() })
		}
		first <- err
	}()
	awaitClosed(t, registered, "alice's registration")

	_, err := secDialErr(gw.WS, bearer(secLongToken(t, "alice")))
	refusedWith(t, err, http.StatusTooManyRequests)
	secDial(t, gw, "bob")
	_, err = secDialErr(gw.WS, bearer(secLongToken(t, "carol")))
	refusedWith(t, err, http.StatusServiceUnavailable)

	release()
	if err := <-first; err != nil {
		t.Fatalf("alice's first socket: %v", err)
	}
	if n := gw.Conns(); n != 2 {
		t.Errorf("gateway holds %d connections, want 2", n)
	}
}

// TestRegisteringLimit: an upgrade that finds MaxRegistering upgrades
// being registered is refused with 503 at once, and gets in once one of
// them is done.
func TestRegisteringLimit(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.StartGateway(gateway.Config{MaxRegistering: 2})
	by := newBystander(t, sys, sys.Gateway())

	// The places stay held while the upgrade waits: an upgrade that waited
	// for one would end at the handshake timeout, not with a 503.
	release := gw.HoldRegistrations(2)
	_, err := secDialErr(gw.WS, bearer(secLongToken(t, "alice")))
	if body := refusedWith(t, err, http.StatusServiceUnavailable); !strings.Contains(body, "being registered") {
		t.Errorf("refusal %q does not say why", body)
	}
	if gw.Conns() != 0 {
		t.Errorf("gateway holds %d connections, want 0", gw.Conns())
	}
	if _, _, err := sys.Store.Status(context.Background(), "alice"); !errors.Is(err, presence.ErrNotFound) {
		t.Errorf("alice's record after a refused upgrade: %v, want none", err)
	}
	release()
	c := secDial(t, gw, "alice")
	subscribeSelf(t, c, "in")
	by.check(t)
}

func TestDrainingRefusesUpgrades(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	by := newBystander(t, sys, sys.Gateway())
	gw := sys.StartGateway(gateway.Config{})

	// An upgrade request whose last line is held back while the gateway
	// starts draining.
	nc, err := net.DialTimeout("tcp", gw.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	head := "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	if _, err := io.WriteString(nc, head); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		sys.StopGateway(gw)
	}()
	natstest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if err := gw.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "draining") {
			return fmt.Errorf("gateway not draining yet: %v", err)
		}
		return nil
	})
	if _, err := io.WriteString(nc, "Authorization: Bearer "+secLongToken(t, "alice")+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	if !strings.HasPrefix(line, "HTTP/1.1 503") {
		t.Errorf("upgrade while draining: %q, want 503", strings.TrimSpace(line))
	}
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("gateway did not stop")
	}
	by.check(t)
}

func TestAuthRenewal(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)

	// The first token expires in about two seconds; a fresh one sent with
	// auth keeps the socket open past that.
	exp := time.Now().Add(2 * time.Second)
	c, err := secDialErr(gw.WS, bearer(secToken(t, "alice", exp)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Abort()
	stop := systest.KeepAlive(c, systest.Heartbeat)
	defer stop()
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeAuth, ID: "r1", Token: secLongToken(t, "alice")}); err != nil {
		t.Fatal(err)
	}
	for _, m := range stillOpen(t, c, exp.Add(time.Second)) {
		if m.Type == protocol.TypeError {
			t.Errorf("renewal answered with %+v", m)
		}
	}
	subscribeSelf(t, c, "after-renewal")
	by.check(t)
}

func TestAuthRenewalRefused(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	tests := []struct {
		name  string
		token string
	}{
		{"another user's token", secLongToken(t, "mallory")},
		{"expired token", secToken(t, "alice", time.Now().Add(-time.Minute))},
		{"bad signature", secSign(t, jwt.SigningMethodHS256, []byte("not the secret of the gateway!!"), jwt.RegisteredClaims{
			Subject: "alice", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
		})},
		{"garbage", "garbage"},
		{"no token", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := secDial(t, gw, "alice")
			if err := c.Send(protocol.ClientMessage{Type: protocol.TypeAuth, ID: "a1", Token: tt.token}); err != nil {
				t.Fatal(err)
			}
			code, seen := awaitClose(t, c, systest.EventTimeout)
			if code != protocol.ClosePolicy {
				t.Errorf("closed with %d, want %d", code, protocol.ClosePolicy)
			}
			var got *protocol.ServerMessage
			for i := range seen {
				if seen[i].Type == protocol.TypeError {
					got = &seen[i]
				}
			}
			if got == nil || got.Code != protocol.CodeUnauthorized || got.ID != "a1" || got.Message == "" {
				t.Errorf("frames before the close: %+v; want error unauthorized with id a1", seen)
			}
		})
	}
	// The user whose socket was closed is still who they were: a new
	// socket with their own token works.
	c := secDial(t, gw, "alice")
	subscribeSelf(t, c, "again")
	by.check(t)
}

func TestTokenExpiresOnLiveSocket(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	sys.Mutual("alice", "watcher")
	w := secDial(t, gw, "watcher")
	defer systest.KeepAlive(w, systest.Heartbeat)()

	exp := soonExp()
	c, err := secDialErr(gw.WS+"?token="+secToken(t, "alice", exp), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Abort()
	stop := systest.KeepAlive(c, systest.Heartbeat)
	defer stop()
	if err := w.Subscribe("w", "alice"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, w, "alice", presence.Online)

	awaitExpiryClose(t, c, exp)
	// The socket is gone, so alice goes offline for her watcher.
	systest.AwaitStatus(t, w, "alice", presence.Offline)
	by.check(t)
}

// TestRenewedTokenExpiringSoonerCloses: a token sent with auth that
// expires before the one it replaces closes the socket at its own expiry,
// though nothing else about the connection is due for a TTL of 20 s.
func TestRenewedTokenExpiringSoonerCloses(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{ConnTTL: 20 * time.Second, HeartbeatInterval: 5 * time.Second}})
	gw := sys.Gateway()
	c, err := secDialErr(gw.WS, bearer(secLongToken(t, "alice")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Abort()
	stop := systest.KeepAlive(c, systest.Heartbeat)
	defer stop()

	exp := soonExp()
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeAuth, ID: "r1", Token: secToken(t, "alice", exp)}); err != nil {
		t.Fatal(err)
	}
	awaitExpiryClose(t, c, exp)
}

// soonExp returns a token expiry about two seconds away, in whole seconds
// as a JWT's exp is, at least half a second away.
func soonExp() time.Time {
	exp := time.Now().Add(2 * time.Second).Truncate(time.Second)
	if time.Until(exp) < 500*time.Millisecond {
		exp = exp.Add(time.Second)
	}
	return exp
}

// awaitExpiryClose checks that c is closed with 1008 once its token
// expires at exp, not before it, and at most 5 s after it.
func awaitExpiryClose(t *testing.T, c *client.Conn, exp time.Time) {
	t.Helper()
	code, _ := awaitClose(t, c, time.Until(exp)+5*time.Second)
	closedAt := time.Now()
	if code != protocol.ClosePolicy {
		t.Errorf("closed with %d, want %d", code, protocol.ClosePolicy)
	}
	if closedAt.Before(exp) {
		t.Errorf("closed %v before the token expired", exp.Sub(closedAt))
	}
}

func TestHTTPAPIAuth(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{AllowedOrigins: []string{"https://app.example.com"}}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	now := time.Now()
	routes := []struct {
		method, path string
		body         any
		ok           int // status for an authenticated alice
	}{
		{"GET", "/api/presence/users/bob", nil, http.StatusOK},
		{"POST", "/api/presence/query", map[string]any{"user_ids": []string{"bob"}}, http.StatusOK},
		{"GET", "/api/presence/online", nil, http.StatusForbidden}, // mutual policy: not global presence
		{"GET", "/api/presence/friends", nil, http.StatusOK},
	}
	good := secLongToken(t, "alice")
	creds := []struct {
		name   string
		query  string
		header http.Header
		status int // 0: the route's ok status
		code   string
	}{
		{"no identity", "", nil, http.StatusUnauthorized, "unauthorized"},
		{"garbage bearer", "", bearer("x.y.z"), http.StatusUnauthorized, "unauthorized"},
		{"expired bearer", "", bearer(secToken(t, "alice", now.Add(-time.Minute))), http.StatusUnauthorized, "unauthorized"},
		{"wrong signature", "", bearer(secSign(t, jwt.SigningMethodHS256, []byte("some other secret, not the gateway's"), jwt.RegisteredClaims{
			Subject: "alice", ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)),
		})), http.StatusUnauthorized, "unauthorized"},
		{"dev auth user while off", "?user=alice", nil, http.StatusUnauthorized, "unauthorized"},
		{"refused origin", "", http.Header{"Authorization": {"Bearer " + good}, "Origin": {"https://evil.example"}}, http.StatusForbidden, "forbidden_origin"},
		{"bearer header", "", bearer(good), 0, ""},
		{"token query", "?token=" + good, nil, 0, ""},
		{"allowed origin", "", http.Header{"Authorization": {"Bearer " + good}, "Origin": {"https://app.example.com"}}, 0, ""},
	}
	for _, r := range routes {
		for _, cr := range creds {
			t.Run(r.method+" "+r.path+"/"+cr.name, func(t *testing.T) {
				var e apiErr
				st := apiCall(t, r.method, gw.HTTP+r.path+cr.query, cr.header, r.body, &e)
				want := cr.status
				if want == 0 {
					want = r.ok
				}
				if st != want {
					t.Fatalf("%d %+v, want %d", st, e, want)
				}
				if cr.code != "" && (e.Error != cr.code || e.Message == "") {
					t.Errorf("error body %+v, want error %q with a message", e, cr.code)
				}
			})
		}
	}
	// Health and metrics need no identity.
	for _, p := range []string{"/healthz", "/readyz"} {
		if st := apiCall(t, "GET", gw.HTTP+p, nil, nil, nil); st != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", p, st)
		}
	}
}

func TestPolicies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		policy gateway.Policy
		// What alice, who follows bob, may do: watch bob (who does not
		// follow her back), watch carol (mutual), watch dave (no edge).
		bob, carol, dave string // "" allowed, else the denial reason
	}{
		{gateway.PolicyMutual, protocol.ReasonNotMutualFollowers, "", protocol.ReasonNotMutualFollowers},
		{gateway.PolicyFollow, "", "", protocol.ReasonNotFollowing},
		{gateway.PolicyEveryone, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(string(tt.policy), func(t *testing.T) {
			sys := secStart(t, systest.Options{Gateway: gateway.Config{Policy: tt.policy}})
			gw := sys.Gateway()
			sys.Follow("alice", "bob")
			sys.Mutual("alice", "carol")
			sys.Follow("dave", "alice") // an edge the other way decides nothing
			a := secDial(t, gw, "alice")
			defer systest.KeepAlive(a, systest.Heartbeat)()
			if err := a.Subscribe("p", "bob", "carol", "dave", "alice"); err != nil {
				t.Fatal(err)
			}
			init := systest.Await(t, a, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool {
				return m.Type == protocol.TypePresenceInit && m.ID == "p"
			})
			allowed := map[string]bool{}
			for _, p := range init.Users {
				allowed[p.UserID] = true
			}
			denied := map[string]string{}
			for range 4 - len(init.Users) {
				m := systest.Await(t, a, systest.EventTimeout, "denied", func(m protocol.ServerMessage) bool {
					return m.Type == protocol.TypeDenied
				})
				if m.ID != "p" {
					t.Errorf("denied %+v does not echo id p", m)
				}
				denied[m.UserID] = m.Reason
			}
			if !allowed["alice"] {
				t.Errorf("alice may not watch herself: %+v", init.Users)
			}
			for user, want := range map[string]string{"bob": tt.bob, "carol": tt.carol, "dave": tt.dave} {
				switch {
				case want == "" && !allowed[user]:
					t.Errorf("%s denied (%q), want allowed", user, denied[user])
				case want != "" && denied[user] != want:
					t.Errorf("%s: allowed %v, denied %q; want denied %q", user, allowed[user], denied[user], want)
				}
				// The HTTP API decides the same.
				var p presence.Presence
				st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/"+user, bearer(secLongToken(t, "alice")), nil, &p)
				if want == "" && st != http.StatusOK || want != "" && st != http.StatusForbidden {
					t.Errorf("GET users/%s: %d, want %s", user, st, map[bool]string{true: "200", false: "403"}[want == ""])
				}
			}

			// Global presence only under the everyone policy.
			if tt.policy == gateway.PolicyEveryone {
				natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
					var online struct{ Count int }
					if st := apiCall(t, "GET", gw.HTTP+"/api/presence/online", bearer(secLongToken(t, "alice")), nil, &online); st != 200 || online.Count != 1 {
						return fmt.Errorf("online: %d %+v, want alice", st, online)
					}
					return nil
				})
			}
			if err := a.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: "all", All: true}); err != nil {
				t.Fatal(err)
			}
			m := systest.Await(t, a, systest.EventTimeout, "answer to all", func(m protocol.ServerMessage) bool {
				return m.ID == "all"
			})
			var online struct {
				Count int                 `json:"count"`
				Users []presence.Presence `json:"users"`
			}
			st := apiCall(t, "GET", gw.HTTP+"/api/presence/online", bearer(secLongToken(t, "alice")), nil, &online)
			if tt.policy == gateway.PolicyEveryone {
				if m.Type != protocol.TypePresenceInit || m.OnlineCount == nil || *m.OnlineCount != 1 || len(m.Users) != 1 || m.Users[0].UserID != "alice" {
					t.Errorf("subscribe all: %+v, want presence_init with alice and online_count 1", m)
				}
				if st != http.StatusOK || online.Count != 1 || len(online.Users) != 1 {
					t.Errorf("GET online: %d %+v, want alice only", st, online)
				}
			} else {
				if m.Type != protocol.TypeDenied || m.UserID != "*" || m.Reason != protocol.ReasonNotAllowed {
					t.Errorf("subscribe all: %+v, want denied not_allowed for *", m)
				}
				if st != http.StatusForbidden {
					t.Errorf("GET online: %d, want 403", st)
				}
			}
		})
	}
}

func TestGlobalPresence(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.Gateway()
	w := secDial(t, gw, "watcher")
	defer systest.KeepAlive(w, systest.Heartbeat)()
	var users []*client.Conn
	for _, u := range []string{"u1", "u2", "u3"} {
		c := secDial(t, gw, u)
		defer systest.KeepAlive(c, systest.Heartbeat)()
		users = append(users, c)
	}
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		var online struct{ Count int }
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/online", bearer(secLongToken(t, "watcher")), nil, &online); st != 200 || online.Count != 4 {
			return fmt.Errorf("online: %d %+v, want 4", st, online)
		}
		return nil
	})
	if err := w.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: "g", All: true}); err != nil {
		t.Fatal(err)
	}
	init := systest.Await(t, w, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "g"
	})
	if init.OnlineCount == nil || *init.OnlineCount != 4 || len(init.Users) != 4 {
		t.Fatalf("presence_init = %+v, want 4 users online", init)
	}
	// Every change of anyone reaches the global watcher: a status change,
	// a new user, a user leaving.
	if err := users[0].SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, w, "u1", presence.Busy)
	newcomer := secDial(t, gw, "u4")
	defer systest.KeepAlive(newcomer, systest.Heartbeat)()
	systest.AwaitStatus(t, w, "u4", presence.Online)
	if err := users[2].Close(); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, w, "u3", presence.Offline)
	// A limit below the count lists the first users by id, with the full
	// count.
	var online struct {
		Count int                 `json:"count"`
		Users []presence.Presence `json:"users"`
	}
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/online?limit=2", bearer(secLongToken(t, "watcher")), nil, &online); st != 200 || online.Count != 4 || len(online.Users) != 2 || online.Users[0].UserID != "u1" {
		t.Errorf("online?limit=2: %d %+v, want 2 of 4 users from u1", st, online)
	}
	for _, q := range []string{"?limit=0", "?limit=x", "?limit=1001"} {
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/online"+q, bearer(secLongToken(t, "watcher")), nil, nil); st != http.StatusBadRequest {
			t.Errorf("online%s: %d, want 400", q, st)
		}
	}
}

func TestGraphChangesReachLiveSubscriptions(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob", "carol")
	a := secDial(t, gw, "alice")
	defer systest.KeepAlive(a, systest.Heartbeat)()
	b := secDial(t, gw, "bob")
	defer systest.KeepAlive(b, systest.Heartbeat)()
	c := secDial(t, gw, "carol")
	defer systest.KeepAlive(c, systest.Heartbeat)()
	if err := a.Subscribe("s", "bob", "carol"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, a, "bob", presence.Online)

	// Bob stops following alice: alice's subscription to bob ends with a
	// denied frame, within seconds.
	changed := time.Now()
	if err := sys.Store.Unfollow(context.Background(), "bob", "alice"); err != nil {
		t.Fatal(err)
	}
	d := systest.Await(t, a, systest.EventTimeout, "denied bob", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeDenied && m.UserID == "bob"
	})
	if d.Reason != protocol.ReasonNotMutualFollowers {
		t.Errorf("denied = %+v, want not_mutual_followers", d)
	}
	if took := time.Since(changed); took > 3*time.Second {
		t.Errorf("unfollow took %v to reach the live subscription", took)
	}
	// Bob's changes no longer reach alice; carol's still do, after them.
	if err := b.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, b, presence.Busy, 1)
	if err := c.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, a, systest.EventTimeout, "carol busy", func(m protocol.ServerMessage) bool {
		for _, p := range m.Updates {
			if p.UserID == "bob" {
				t.Errorf("update of bob after the unfollow: %+v", m)
			}
		}
		for _, p := range m.Updates {
			if p.UserID == "carol" && p.Status == presence.Busy {
				return true
			}
		}
		return false
	})
	// A new subscription to bob is refused; following again allows it.
	if err := a.Subscribe("s2", "bob"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, a, systest.EventTimeout, "denied bob again", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeDenied && m.UserID == "bob" && m.ID == "s2"
	})
	sys.Follow("bob", "alice")
	natstest.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		var p presence.Presence
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob", bearer(secLongToken(t, "alice")), nil, &p); st != 200 {
			return fmt.Errorf("GET bob: %d", st)
		}
		return nil
	})
	if err := a.Subscribe("s3", "bob"); err != nil {
		t.Fatal(err)
	}
	init := systest.Await(t, a, systest.EventTimeout, "presence_init s3", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "s3"
	})
	if len(init.Users) != 1 || init.Users[0].Status != presence.Busy {
		t.Errorf("presence_init after following again = %+v, want bob busy", init)
	}
}

// TestAbuseLeavesOthersIntact runs hostile sockets of one user next to a
// bystander pair on the same gateway: whatever the hostile user sends, the
// bystanders' presence and subscriptions stay right.
func TestAbuseLeavesOthersIntact(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	// mallory follows the bystander, who does not follow back.
	sys.Follow("mallory", by.subjectID)
	abuse := []struct {
		name string
		msgs []string
	}{
		{"watch without consent", []string{`{"type":"subscribe","user_ids":["bystander"]}`}},
		{"set another user's status", []string{`{"type":"set_status","status":"invisible","user_id":"bystander"}`}},
		{"idle for another user", []string{`{"type":"idle","user_id":"bystander","conn_id":"` + by.subject.Hello.ConnID + `"}`}},
		{"unsubscribe another socket", []string{`{"type":"unsubscribe","user_ids":["bystander"],"conn_id":"` + by.watch.Hello.ConnID + `"}`}},
		{"subject injection", []string{`{"type":"subscribe","user_ids":["bystander.>","*","bystander *",">"]}`}},
		{"global presence under mutual", []string{`{"type":"subscribe","all":true}`}},
		{"invalid JSON and types", []string{`{`, `[]`, `{"type":1}`, `{"type":"set_status","status":"offline"}`, `{"type":"nope"}`}},
		{"renew as someone else", []string{`{"type":"auth","token":"` + secLongToken(t, by.subjectID) + `"}`}},
	}
	for _, tt := range abuse {
		t.Run(tt.name, func(t *testing.T) {
			m := secDial(t, gw, "mallory")
			for _, raw := range tt.msgs {
				if err := m.SendRaw(ws.OpText, []byte(raw)); err != nil {
					t.Fatal(err)
				}
			}
			// Messages are handled in order: once the answer to a last
			// subscribe arrives, every answer to the hostile ones has too.
			// None of them tells the bystander's presence.
			_ = m.Subscribe("sync", "mallory")
			_ = m.SetReadDeadline(time.Now().Add(systest.EventTimeout))
			for range 1000 {
				msg, _, err := m.Read()
				if err != nil {
					var ce *client.CloseError
					if !errors.As(err, &ce) {
						t.Errorf("hostile socket: %v, want answers or a close frame", err)
					}
					break
				}
				for _, p := range append(msg.Users, msg.Updates...) {
					if p.UserID == by.subjectID {
						t.Errorf("mallory was told the bystander's presence: %+v", msg)
					}
				}
				if msg.Type == protocol.TypePresenceInit && msg.ID == "sync" {
					break
				}
			}
			by.check(t)
		})
	}
}

// TestUnfollowWhileSubscribing: bob stops following alice after the
// gateway decided her subscribe to bob but before it registered it. The
// subscription must not be registered as allowed: alice is denied bob, and
// none of bob's changes reach her.
func TestUnfollowWhileSubscribing(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{AuthzCacheTTL: time.Hour}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob", "carol")
	a := secDial(t, gw, "alice")
	defer systest.KeepAlive(a, systest.Heartbeat)()
	b := secDial(t, gw, "bob")
	defer systest.KeepAlive(b, systest.Heartbeat)()
	c := secDial(t, gw, "carol")
	defer systest.KeepAlive(c, systest.Heartbeat)()

	var once sync.Once
	gw.AfterDecide(func() {
		once.Do(func() {
			if err := sys.Store.Unfollow(context.Background(), "bob", "alice"); err != nil {
				t.Error(err)
				return
			}
			// Wait until the gateway has seen the change: its cached
			// answer is gone, and a fresh read says no.
			natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
				if ok, err := gw.MayWatch("alice", "bob"); err != nil || ok {
					return fmt.Errorf("the gateway still lets alice watch bob (%v)", err)
				}
				return nil
			})
		})
	})
	if err := a.Subscribe("s", "bob", "carol"); err != nil {
		t.Fatal(err)
	}
	init := systest.Await(t, a, systest.EventTimeout, "presence_init", isType(protocol.TypePresenceInit))
	for _, p := range init.Users {
		if p.UserID == "bob" {
			t.Errorf("presence_init shows bob after he stopped following alice: %+v", init.Users)
		}
	}
	systest.Await(t, a, systest.EventTimeout, "denied bob", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeDenied && m.UserID == "bob" && m.Reason == protocol.ReasonNotMutualFollowers
	})
	// bob's change must not reach alice; carol's, made after it, must.
	if err := b.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, b, presence.Busy, 1)
	if err := c.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, a, systest.EventTimeout, "carol busy", func(m protocol.ServerMessage) bool {
		for _, p := range m.Updates {
			if p.UserID == "bob" {
				t.Errorf("alice got bob's change after he stopped following her: %+v", m.Updates)
			}
		}
		for _, p := range m.Updates {
			if p.UserID == "carol" && p.Status == presence.Busy {
				return true
			}
		}
		return false
	})
}
