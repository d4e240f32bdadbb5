package gateway_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/nats-io/nats.go/micro"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/system/systest"
)

// proxyQuestion is what a gateway asks its connect proxy.
type proxyQuestion struct {
	Type    string            `json:"type"`
	Headers map[string]string `json:"headers"`
	UserID  string            `json:"user_id"`
	Session string            `json:"session"`
}

// proxyApp is the app's side of the connect proxy: its sessions, by the
// value of the sessionid cookie, each the answer it gets; a session not
// listed is refused. Its HTTP endpoint verifies every signature.
type proxyApp struct {
	mu       sync.Mutex
	sessions map[string]any
	asked    []proxyQuestion
	badSigs  int
	// handle, when set, handles a question instead, unless it returns
	// false.
	handle func(w http.ResponseWriter, r *http.Request, q proxyQuestion) bool
}

func newProxyApp() *proxyApp { return &proxyApp{sessions: map[string]any{}} }

// set gives session the answer a (nil: refused).
func (a *proxyApp) set(session string, answer any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if answer == nil {
		delete(a.sessions, session)
		return
	}
	a.sessions[session] = answer
}

// questions returns the questions asked so far.
func (a *proxyApp) questions() []proxyQuestion {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]proxyQuestion(nil), a.asked...)
}

// answer records q and returns the answer to it: the answer of the
// session its cookie (a connect) or its session (a refresh) names.
func (a *proxyApp) answer(q proxyQuestion) any {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, q)
	session := q.Session
	if q.Type == "connect" {
		session = ""
		if c, err := http.ParseCookie(q.Headers["Cookie"]); err == nil {
			for _, c := range c {
				if c.Name == "sessionid" {
					session = c.Value
				}
			}
		}
	}
	if ans, ok := a.sessions[session]; ok {
		return ans
	}
	return map[string]any{"refuse": true}
}

func (a *proxyApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	if err := verifyGreendot(appSecret, r, body); err != nil {
		a.mu.Lock()
		a.badSigs++
		a.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var q proxyQuestion
	if err := json.Unmarshal(body, &q); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	handle := a.handle
	a.mu.Unlock()
	if handle != nil && handle(w, r, q) {
		a.mu.Lock()
		a.asked = append(a.asked, q)
		a.mu.Unlock()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(a.answer(q))
}

// serveHTTP runs the app's endpoint until the test ends, and checks then
// that every question was signed.
func (a *proxyApp) serveHTTP(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(a)
	t.Cleanup(func() {
		srv.Close()
		if a.badSigs > 0 {
			t.Errorf("%d questions without a good signature", a.badSigs)
		}
	})
	return srv
}

// proxyGateway runs a system whose gateway asks the connect proxy at url
// (with tokens too, for the tests of a token sent anyway).
func proxyGateway(t *testing.T, url string, cfg gateway.Config) (*systest.System, *systest.Gateway) {
	cfg.ConnectProxyURL, cfg.AppSecret = url, appSecret
	sys := secStart(t, systest.Options{Gateway: cfg})
	return sys, sys.Gateway()
}

// cookie returns the headers of a browser whose session is id.
func cookie(id string) http.Header {
	return http.Header{"Cookie": {"csrftoken=x; sessionid=" + id}}
}

// proxyDial connects with the headers h, and fails the test unless the
// gateway admits user.
func proxyDial(t *testing.T, gw *systest.Gateway, h http.Header, user string) *client.Conn {
	t.Helper()
	c, err := secDialErr(gw.WS, h)
	if err != nil {
		t.Fatalf("dial: %v, want %s admitted", err, user)
	}
	t.Cleanup(func() { _ = c.Abort() })
	if c.Hello.UserID != user {
		t.Fatalf("hello for %q, want %q", c.Hello.UserID, user)
	}
	return c
}

func TestConnectProxyAllow(t *testing.T) {
	t.Parallel()
	a := newProxyApp()
	a.set("s-alice", map[string]any{"user_id": "alice", "expires_in": 3600, "rooms": []string{"doc:*"}})
	srv := a.serveHTTP(t)
	_, gw := proxyGateway(t, srv.URL, gateway.Config{ConnectProxyHeaders: []string{"x-client-version"}})

	h := cookie("s-alice")
	h.Set("X-Client-Version", "1.2")
	h.Set("X-Not-Forwarded", "secret")
	c := proxyDial(t, gw, h, "alice")
	qs := a.questions()
	if len(qs) != 1 {
		t.Fatalf("%d questions, want 1", len(qs))
	}
	want := map[string]string{"Cookie": "csrftoken=x; sessionid=s-alice", "X-Client-Version": "1.2"}
	if q := qs[0]; q.Type != "connect" || len(q.Headers) != len(want) || q.Headers["Cookie"] != want["Cookie"] || q.Headers["X-Client-Version"] != "1.2" {
		t.Errorf("question = %+v, want a connect with headers %v", q, want)
	}
	// The rooms claim of the answer is the connection's grant.
	joinRoom(t, c, "j1", "doc:1", "")
	sendRoom(t, c, protocol.TypeJoin, "j2", "chat:1", "")
	systest.Await(t, c, systest.EventTimeout, "room_denied j2", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeRoomDenied && m.ID == "j2" && m.Reason == protocol.ReasonNotAllowed
	})
	subscribeSelf(t, c, "self")

	// A token decides alone: the app is not asked, and a bad token is not
	// rescued by the cookie.
	tok := bearer(secLongToken(t, "bob"))
	tok.Set("Cookie", "sessionid=s-alice")
	proxyDial(t, gw, tok, "bob")
	bad := bearer("not.a.jwt")
	bad.Set("Cookie", "sessionid=s-alice")
	_, err := secDialErr(gw.WS, bad)
	refusedWith(t, err, http.StatusUnauthorized)
	if n := len(a.questions()); n != 1 {
		t.Errorf("%d questions after two upgrades with tokens, want still 1", n)
	}
	if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_connect_proxy_answers_total", "type", "connect", "result", "allowed"); v != 1 {
		t.Errorf("allowed answers = %v, want 1", v)
	}
}

func TestConnectProxyRefuse(t *testing.T) {
	t.Parallel()
	a := newProxyApp()
	srv := a.serveHTTP(t)
	_, gw := proxyGateway(t, srv.URL, gateway.Config{})
	for name, h := range map[string]http.Header{"unknown session": cookie("nobody"), "no cookie": nil} {
		_, err := secDialErr(gw.WS, h)
		if body := refusedWith(t, err, http.StatusUnauthorized); !strings.Contains(body, "refused the session") {
			t.Errorf("%s: refusal %q does not say the app refused the session", name, body)
		}
	}
	if n := len(a.questions()); n != 2 {
		t.Errorf("%d questions, want 2", n)
	}
	if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_connect_proxy_answers_total", "type", "connect", "result", "refused"); v != 2 {
		t.Errorf("refused answers = %v, want 2", v)
	}
}

// TestConnectProxyDown: an app that fails, answers nonsense or is not
// there refuses the upgrade with 503; the failure is not remembered, so
// the app, back, admits the next.
func TestConnectProxyDown(t *testing.T) {
	t.Parallel()
	a := newProxyApp()
	a.set("s-alice", map[string]any{"user_id": "alice", "expires_in": 3600})
	srv := a.serveHTTP(t)
	_, gw := proxyGateway(t, srv.URL, gateway.Config{ConnectProxyTimeout: 500 * time.Millisecond})
	for name, answer := range map[string]func(w http.ResponseWriter){
		"500":         func(w http.ResponseWriter) { http.Error(w, "boom", http.StatusInternalServerError) },
		"403":         func(w http.ResponseWriter) { http.Error(w, "forbidden", http.StatusForbidden) },
		"not JSON":    func(w http.ResponseWriter) { _, _ = io.WriteString(w, "<html>login</html>") },
		"bad user id": func(w http.ResponseWriter) { _, _ = io.WriteString(w, `{"user_id":"al ice","expires_in":60}`) },
		"no expiry":   func(w http.ResponseWriter) { _, _ = io.WriteString(w, `{"user_id":"alice"}`) },
		"unknown field": func(w http.ResponseWriter) {
			_, _ = io.WriteString(w, `{"user_id":"alice","expires_in":60,"admin":true}`)
		},
		"bad rooms": func(w http.ResponseWriter) {
			_, _ = io.WriteString(w, `{"user_id":"alice","expires_in":60,"rooms":"doc:1"}`)
		},
	} {
		a.mu.Lock()
		a.handle = func(w http.ResponseWriter, _ *http.Request, _ proxyQuestion) bool { answer(w); return true }
		a.mu.Unlock()
		_, err := secDialErr(gw.WS, cookie("s-alice"))
		if body := refusedWith(t, err, http.StatusServiceUnavailable); !strings.Contains(body, "try again") {
			t.Errorf("%s: refusal %q", name, body)
		}
	}
	a.mu.Lock()
	a.handle = nil
	a.mu.Unlock()
	proxyDial(t, gw, cookie("s-alice"), "alice")

	// Nobody listening: 503 too, within the timeout.
	url := srv.URL
	srv.Close()
	_, gw2 := proxyGateway(t, url, gateway.Config{ConnectProxyTimeout: 300 * time.Millisecond})
	_, err := secDialErr(gw2.WS, cookie("s-alice"))
	refusedWith(t, err, http.StatusServiceUnavailable)
	if v, _ := metricstest.Value(gw2.Registry(), "greendot_gateway_connect_proxy_answers_total", "type", "connect", "result", "failed"); v != 1 {
		t.Errorf("failed answers = %v, want 1", v)
	}
}

// TestConnectProxySlow: an upgrade waiting for a slow app holds no other
// work of the gateway: a socket with a token is admitted meanwhile, though
// the gateway registers one upgrade at a time; at most --max-registering
// upgrades wait for the app (one more is refused at once), and the one
// waiting is refused 503 at the timeout.
func TestConnectProxySlow(t *testing.T) {
	t.Parallel()
	a := newProxyApp()
	a.set("s-alice", map[string]any{"user_id": "alice", "expires_in": 3600})
	asked := make(chan struct{}, 1)
	a.handle = func(_ http.ResponseWriter, r *http.Request, _ proxyQuestion) bool {
		asked <- struct{}{}
		<-r.Context().Done()
		return true
	}
	srv := a.serveHTTP(t)
	_, gw := proxyGateway(t, srv.URL, gateway.Config{ConnectProxyTimeout: 3 * time.Second, MaxRegistering: 1})

	slow := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := secDialErr(gw.WS, cookie("s-alice"))
		slow <- err
	}()
	<-asked
	// The only place to wait for the app is taken: another upgrade to be
	// asked about is refused now.
	_, err := secDialErr(gw.WS, cookie("s-alice"))
	if body := refusedWith(t, err, http.StatusServiceUnavailable); !strings.Contains(body, "too many connections waiting for the app") {
		t.Errorf("second upgrade refused with %q", body)
	}
	// A socket with a token is admitted meanwhile.
	subscribeSelf(t, secDial(t, gw, "bob"), "bob")
	select {
	case err := <-slow:
		t.Fatalf("the slow upgrade ended before its timeout: %v", err)
	default:
	}
	err = <-slow
	refusedWith(t, err, http.StatusServiceUnavailable)
	if took := time.Since(start); took < 3*time.Second {
		t.Errorf("refused after %v, before the 3s timeout", took)
	}
}

func TestConnectProxyConfig(t *testing.T) {
	t.Parallel()
	ok := gateway.Config{ConnectProxyURL: "http://app.example/proxy", AppSecret: appSecret}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, set := range map[string]func(*gateway.Config){
		"URL and subject":         func(c *gateway.Config) { c.ConnectProxySubject = "app.connect" },
		"no secret":               func(c *gateway.Config) { c.AppSecret = nil },
		"not http":                func(c *gateway.Config) { c.ConnectProxyURL = "ftp://app.example/" },
		"no host":                 func(c *gateway.Config) { c.ConnectProxyURL = "http:///proxy" },
		"dev auth":                func(c *gateway.Config) { c.DevAuth = true },
		"timeout over handshake":  func(c *gateway.Config) { c.ConnectProxyTimeout = 10 * time.Second },
		"negative timeout":        func(c *gateway.Config) { c.ConnectProxyTimeout = -time.Second },
		"cookie listed":           func(c *gateway.Config) { c.ConnectProxyHeaders = []string{"cookie"} },
		"bad header name":         func(c *gateway.Config) { c.ConnectProxyHeaders = []string{"X Client"} },
		"header twice":            func(c *gateway.Config) { c.ConnectProxyHeaders = []string{"X-A", "x-a"} },
		"headers without a proxy": func(c *gateway.Config) { c.ConnectProxyURL = ""; c.ConnectProxyHeaders = []string{"X-A"} },
		"wildcard subject":        func(c *gateway.Config) { c.ConnectProxyURL = ""; c.ConnectProxySubject = "app.*" },
	} {
		cfg := ok
		set(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, gateway.ErrInvalidConfig) {
			t.Errorf("%s: %v, want an invalid config", name, err)
		}
	}
	// Policy token takes its watch lists from the proxy's answers.
	tok := ok
	tok.Policy = gateway.PolicyToken
	if err := tok.Validate(); err != nil {
		t.Errorf("policy token with a connect proxy: %v", err)
	}
}

// serveNATS answers the questions of subject with a micro service, as
// docs/integration.md shows, until the test ends; hold, when set, is
// waited on before each answer.
func (a *proxyApp) serveNATS(t *testing.T, sys *systest.System, subject string, hold <-chan struct{}) {
	svc, err := micro.AddService(sys.NC, micro.Config{
		Name:    "connect",
		Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{
			Subject: subject,
			Handler: micro.HandlerFunc(func(req micro.Request) {
				var q proxyQuestion
				if err := json.Unmarshal(req.Data(), &q); err != nil {
					_ = req.Error("400", "bad question", nil)
					return
				}
				if hold != nil {
					<-hold
				}
				_ = req.RespondJSON(a.answer(q))
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
}

// TestConnectProxyNATS: the same questions over NATS request/reply:
// allowed, refused, nobody answering (503) and an app too slow (503).
func TestConnectProxyNATS(t *testing.T) {
	t.Parallel()
	a := newProxyApp()
	a.set("s-alice", map[string]any{"user_id": "alice", "expires_in": 3600})
	sys := secStart(t, systest.Options{Gateway: gateway.Config{ConnectProxySubject: "app.connect", ConnectProxyTimeout: 500 * time.Millisecond}})
	gw := sys.Gateway()

	// Nobody answers yet.
	_, err := secDialErr(gw.WS, cookie("s-alice"))
	refusedWith(t, err, http.StatusServiceUnavailable)

	a.serveNATS(t, sys, "app.connect", nil)
	proxyDial(t, gw, cookie("s-alice"), "alice")
	_, err = secDialErr(gw.WS, cookie("s-mallory"))
	refusedWith(t, err, http.StatusUnauthorized)
	if qs := a.questions(); len(qs) != 2 || qs[0].Type != "connect" || qs[0].Headers["Cookie"] != "csrftoken=x; sessionid=s-alice" {
		t.Errorf("questions = %+v", qs)
	}

	// An app slower than the timeout.
	hold := make(chan struct{})
	defer close(hold)
	a.serveNATS(t, sys, "app.slow", hold)
	slow := sys.StartGateway(gateway.Config{ConnectProxySubject: "app.slow", ConnectProxyTimeout: 300 * time.Millisecond, Tokens: secVerifier(t)})
	_, err = secDialErr(slow.WS, cookie("s-alice"))
	refusedWith(t, err, http.StatusServiceUnavailable)
}

// awaitCloseReason reads c until the gateway closes it, and returns the
// close frame's code and reason.
func awaitCloseReason(t *testing.T, c *client.Conn, timeout time.Duration) (ws.StatusCode, string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	for {
		_, raw, err := c.Read()
		if err == nil {
			continue
		}
		var ce *client.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("waiting for a close frame: %v (%s)", err, raw)
		}
		return ce.Code, ce.Reason
	}
}

// awaitQuestions waits until the app was asked n questions, and returns
// them.
func (a *proxyApp) awaitQuestions(t *testing.T, n int) []proxyQuestion {
	t.Helper()
	var qs []proxyQuestion
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if qs = a.questions(); len(qs) < n {
			return fmt.Errorf("%d questions, want %d", len(qs), n)
		}
		return nil
	})
	return qs
}

// TestConnectProxyRefresh: a session is asked about again before its
// expiry, with the user and the session value of the last answer; the new
// answer's expiry keeps the socket open past the first, and its rooms
// claim replaces the first's. An auth message is refused on such a
// socket.
func TestConnectProxyRefresh(t *testing.T) {
	t.Parallel()
	a := newProxyApp()
	a.set("s-alice", map[string]any{"user_id": "alice", "expires_in": 2, "session": "v1", "rooms": []string{"doc:*"}})
	a.set("v1", map[string]any{"user_id": "alice", "expires_in": 3600, "session": "v2", "rooms": []string{"chat:*"}})
	srv := a.serveHTTP(t)
	_, gw := proxyGateway(t, srv.URL, gateway.Config{ConnectProxyTimeout: 500 * time.Millisecond})
	start := time.Now()
	c := proxyDial(t, gw, cookie("s-alice"), "alice")
	defer systest.KeepAlive(c, systest.Heartbeat)()
	joinRoom(t, c, "j1", "doc:1", "")

	qs := a.awaitQuestions(t, 2)
	if q := qs[1]; q.Type != "refresh" || q.UserID != "alice" || q.Session != "v1" || len(q.Headers) != 0 {
		t.Errorf("refresh question = %+v, want alice's session v1", q)
	}
	// The room the new answer no longer allows is left, with room_denied.
	systest.Await(t, c, systest.EventTimeout, "room_denied doc:1", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeRoomDenied && m.Room == "doc:1"
	})
	for _, m := range stillOpen(t, c, start.Add(3*time.Second)) {
		if m.Type == protocol.TypeError {
			t.Errorf("refreshed socket got %+v", m)
		}
	}
	joinRoom(t, c, "j2", "chat:1", "")
	if n := len(a.questions()); n != 2 {
		t.Errorf("%d questions, want 2: the next refresh is an hour away", n)
	}
	if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_connect_proxy_answers_total", "type", "refresh", "result", "allowed"); v != 1 {
		t.Errorf("allowed refreshes = %v, want 1", v)
	}

	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeAuth, ID: "a1", Token: secLongToken(t, "alice")}); err != nil {
		t.Fatal(err)
	}
	if code, reason := awaitCloseReason(t, c, systest.EventTimeout); code != protocol.ClosePolicy || reason != "unauthorized" {
		t.Errorf("auth on a proxied socket: closed with %d %q, want %d unauthorized", code, reason, protocol.ClosePolicy)
	}
}

// TestConnectProxySessionEnd: the app refusing a refresh (the user signed
// out) closes the socket with 1008 "session ended", before its expiry.
func TestConnectProxySessionEnd(t *testing.T) {
	t.Parallel()
	a := newProxyApp()
	a.set("s-alice", map[string]any{"user_id": "alice", "expires_in": 4, "session": "v1"})
	srv := a.serveHTTP(t)
	_, gw := proxyGateway(t, srv.URL, gateway.Config{ConnectProxyTimeout: 500 * time.Millisecond})
	c := proxyDial(t, gw, cookie("s-alice"), "alice")
	defer systest.KeepAlive(c, systest.Heartbeat)()
	exp := time.Now().Add(4 * time.Second)
	code, reason := awaitCloseReason(t, c, 10*time.Second)
	if code != protocol.ClosePolicy || reason != "session ended" {
		t.Errorf("closed with %d %q, want %d \"session ended\"", code, reason, protocol.ClosePolicy)
	}
	if time.Now().After(exp) {
		t.Errorf("closed after the session's expiry, not at its refresh")
	}
	if qs := a.questions(); len(qs) != 2 || qs[1].Type != "refresh" {
		t.Errorf("questions = %+v, want a connect and a refresh", qs)
	}
	if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_connect_proxy_answers_total", "type", "refresh", "result", "refused"); v != 1 {
		t.Errorf("refused refreshes = %v, want 1", v)
	}

	// A refresh answered for another user ends the session too: a socket
	// never changes who it is.
	a.set("s-bob", map[string]any{"user_id": "bob", "expires_in": 4, "session": "b1"})
	a.set("b1", map[string]any{"user_id": "mallory", "expires_in": 3600})
	b := proxyDial(t, gw, cookie("s-bob"), "bob")
	defer systest.KeepAlive(b, systest.Heartbeat)()
	exp = time.Now().Add(4 * time.Second)
	if code, reason := awaitCloseReason(t, b, 10*time.Second); code != protocol.ClosePolicy || reason != "session ended" {
		t.Errorf("refresh for another user: closed with %d %q, want %d \"session ended\"", code, reason, protocol.ClosePolicy)
	}
	if time.Now().After(exp) {
		t.Errorf("closed after the session's expiry, not at its refresh")
	}
}

// TestConnectProxyRefreshDown: a refresh with no good answer keeps the
// socket and is asked again; answered meanwhile, the socket lives on; an
// app down until the expiry closes it then, with 1008 "session expired".
func TestConnectProxyRefreshDown(t *testing.T) {
	t.Parallel()
	t.Run("back before the expiry", func(t *testing.T) {
		t.Parallel()
		a := newProxyApp()
		// Refreshed 3 s before its expiry, and again a second later.
		a.set("s-alice", map[string]any{"user_id": "alice", "expires_in": 12, "session": "v1"})
		a.set("v1", map[string]any{"user_id": "alice", "expires_in": 3600})
		a.handle = func(w http.ResponseWriter, _ *http.Request, q proxyQuestion) bool {
			if q.Type == "refresh" && len(a.questions()) == 1 {
				http.Error(w, "down for a moment", http.StatusInternalServerError)
				return true
			}
			return false
		}
		srv := a.serveHTTP(t)
		_, gw := proxyGateway(t, srv.URL, gateway.Config{ConnectProxyTimeout: 500 * time.Millisecond})
		start := time.Now()
		c := proxyDial(t, gw, cookie("s-alice"), "alice")
		defer systest.KeepAlive(c, systest.Heartbeat)()
		qs := a.awaitQuestions(t, 3)
		if qs[1].Type != "refresh" || qs[2].Type != "refresh" || qs[2].Session != "v1" {
			t.Errorf("questions = %+v, want a connect and two refreshes of v1", qs)
		}
		stillOpen(t, c, start.Add(13*time.Second))
		subscribeSelf(t, c, "alive")
		if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_connect_proxy_answers_total", "type", "refresh", "result", "failed"); v != 1 {
			t.Errorf("failed refreshes = %v, want 1", v)
		}
	})
	t.Run("down until the expiry", func(t *testing.T) {
		t.Parallel()
		a := newProxyApp()
		a.set("s-alice", map[string]any{"user_id": "alice", "expires_in": 2, "session": "v1"})
		a.handle = func(_ http.ResponseWriter, r *http.Request, q proxyQuestion) bool {
			if q.Type == "refresh" {
				<-r.Context().Done() // too slow
				return true
			}
			return false
		}
		srv := a.serveHTTP(t)
		_, gw := proxyGateway(t, srv.URL, gateway.Config{ConnectProxyTimeout: 500 * time.Millisecond})
		c := proxyDial(t, gw, cookie("s-alice"), "alice")
		defer systest.KeepAlive(c, systest.Heartbeat)()
		exp := time.Now().Add(2 * time.Second)
		code, reason := awaitCloseReason(t, c, 10*time.Second)
		if code != protocol.ClosePolicy || reason != "session expired" {
			t.Errorf("closed with %d %q, want %d \"session expired\"", code, reason, protocol.ClosePolicy)
		}
		if time.Now().Before(exp) {
			t.Errorf("closed %v before the session's expiry", time.Until(exp))
		}
	})
}

// TestConnectProxyWatchClaim: under the token policy, the watch claim of
// the proxy's answer is the connection's watch list, as a token's is, and
// one over --token-watch-max is a bad answer (503).
func TestConnectProxyWatchClaim(t *testing.T) {
	t.Parallel()
	a := newProxyApp()
	a.set("s-alice", map[string]any{"user_id": "alice", "expires_in": 3600, "watch": []string{"bob"}})
	a.set("s-big", map[string]any{"user_id": "dave", "expires_in": 3600, "watch": []string{"a", "b", "c"}})
	srv := a.serveHTTP(t)
	_, gw := proxyGateway(t, srv.URL, gateway.Config{Policy: gateway.PolicyToken, TokenMaxWatch: 2})
	online(t, gw, "bob", "carol")
	c := proxyDial(t, gw, cookie("s-alice"), "alice")
	got := subscribeAll(t, c, "s", "bob", "carol")
	if u := got.users(); len(u) != 1 || u[0] != "bob" {
		t.Errorf("presence_init users = %v, want bob", u)
	}
	if got.denied["carol"] != protocol.ReasonNotAllowed {
		t.Errorf("denied = %v, want carol not_allowed", got.denied)
	}
	_, err := secDialErr(gw.WS, cookie("s-big"))
	refusedWith(t, err, http.StatusServiceUnavailable)
}

// docUser is a user of the app's session store of the Go sample of
// docs/integration.md.
type docUser struct {
	ID    string
	Rooms []string
}

// docSessions is that store: sessions by key.
type docSessions map[string]docUser

func (s docSessions) Lookup(key string) (docUser, bool) {
	u, ok := s[key]
	return u, ok
}

// sessions is the store greendotConnect reads.
var sessions = docSessions{"k-42": {ID: "42", Rooms: []string{"team-7:*"}}}

// greendotConnect is the Go connect proxy of docs/integration.md, line for
// line (the test's secret in place of the page's).
func greendotConnect(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	if err := signature.Verify(appSecret, r.Header.Get(signature.Header), body, time.Now(), 5*time.Minute); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var q struct {
		Type    string            `json:"type"` // "connect" or "refresh"
		Headers map[string]string `json:"headers"`
		Session string            `json:"session"`
	}
	if err := json.Unmarshal(body, &q); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	key := q.Session // a refresh names the session of the answer before
	if q.Type == "connect" {
		key = ""
		if cookies, err := http.ParseCookie(q.Headers["Cookie"]); err == nil {
			for _, c := range cookies {
				if c.Name == "sessionid" {
					key = c.Value
				}
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	user, ok := sessions.Lookup(key)
	if !ok {
		_ = json.NewEncoder(w).Encode(map[string]any{"refuse": true})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"user_id": user.ID, "expires_in": 3600, "session": key, "rooms": user.Rooms})
}

// TestConnectProxyGoSample runs the Go connect proxy of
// docs/integration.md behind a gateway: the session's user is let in with
// the rooms of the store, an unknown session refused, and a refresh of
// the session answered.
func TestConnectProxyGoSample(t *testing.T) {
	t.Parallel()
	doctest.Verbatim(t, doctest.Sample(t, "docs/integration.md", "func greendotConnect(w http.ResponseWriter"), "connectproxy_test.go",
		"(secret,", "(appSecret,")
	srv := httptest.NewServer(http.HandlerFunc(greendotConnect))
	t.Cleanup(srv.Close)
	_, gw := proxyGateway(t, srv.URL, gateway.Config{})
	c := proxyDial(t, gw, cookie("k-42"), "42")
	joinRoom(t, c, "j", "team-7:standup", "")
	_, err := secDialErr(gw.WS, cookie("k-nobody"))
	refusedWith(t, err, http.StatusUnauthorized)

	body := []byte(`{"type":"refresh","user_id":"42","session":"k-42"}`)
	req, err := http.NewRequest("POST", srv.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(signature.Header, signature.Sign(appSecret, time.Now(), body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a struct {
		UserID  string `json:"user_id"`
		Session string `json:"session"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || a.UserID != "42" || a.Session != "k-42" {
		t.Errorf("refresh answered %+v, %v; want user 42 and its session", a, err)
	}
}
