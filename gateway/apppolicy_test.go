package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/system/systest"
)

// appSecret is the secret the gateways under test share with the app.
var appSecret = []byte("greendot app callout tests: a shared secret")

// verifyGreendot checks the signature of a question from a gateway, as
// docs/integration.md tells a Go app to.
func verifyGreendot(secret []byte, r *http.Request, body []byte) error {
	return signature.Verify(secret, r.Header.Get(signature.Header), body, time.Now(), 5*time.Minute)
}

// question is what a gateway asks the app.
type question struct {
	Watcher string   `json:"watcher"`
	Targets []string `json:"targets"`
	List    bool     `json:"list"`
}

// app is the app's side of the app policy: who may watch whom, and the
// questions it was asked. Its HTTP endpoint verifies every signature.
type app struct {
	mu      sync.Mutex
	allowed map[[2]string]bool
	asked   []question
	badSigs int
	// fail, when set, answers the nth question (from 1) instead.
	fail func(n int, w http.ResponseWriter, r *http.Request) bool
}

func newApp(pairs ...[2]string) *app {
	a := &app{allowed: map[[2]string]bool{}}
	for _, p := range pairs {
		a.allowed[p] = true
	}
	return a
}

// set allows or forbids watcher to watch target.
func (a *app) set(watcher, target string, on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.allowed[[2]string{watcher, target}] = on
}

// questions returns how many questions the app was asked.
func (a *app) questions() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.asked)
}

// answer records q and returns the users it allows.
func (a *app) answer(q question) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, q)
	allow := []string{}
	if q.List {
		for p, on := range a.allowed {
			if on && p[0] == q.Watcher {
				allow = append(allow, p[1])
			}
		}
		slices.Sort(allow)
		return allow
	}
	for _, t := range q.Targets {
		if a.allowed[[2]string{q.Watcher, t}] {
			allow = append(allow, t)
		}
	}
	return allow
}

// ServeHTTP is the app's authorization endpoint.
func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
	a.mu.Lock()
	n, fail := len(a.asked)+1, a.fail
	a.mu.Unlock()
	if fail != nil && fail(n, w, r) {
		a.mu.Lock()
		a.asked = append(a.asked, question{})
		a.mu.Unlock()
		return
	}
	var q question
	if err := json.Unmarshal(body, &q); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"allow": a.answer(q)})
}

// serveHTTP runs the app's endpoint until the test ends, and checks then
// that every question was signed.
func (a *app) serveHTTP(t *testing.T) string {
	srv := httptest.NewServer(a)
	t.Cleanup(func() {
		srv.Close()
		if a.badSigs > 0 {
			t.Errorf("%d questions without a good signature", a.badSigs)
		}
	})
	return srv.URL
}

// serveNATS answers the questions of subject with a micro service, as
// docs/integration.md shows, until the test ends.
func (a *app) serveNATS(t *testing.T, sys *systest.System, subject string) {
	svc, err := micro.AddService(sys.NC, micro.Config{
		Name:    "authz",
		Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{
			Subject: subject,
			Handler: micro.HandlerFunc(func(req micro.Request) {
				var q question
				if err := json.Unmarshal(req.Data(), &q); err != nil {
					_ = req.Error("400", "bad question", nil)
					return
				}
				_ = req.RespondJSON(map[string]any{"allow": a.answer(q)})
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
}

// appGateway runs a system under the app policy asking at url (or, when
// subject is set, on NATS).
func appGateway(t *testing.T, url, subject string, timeout time.Duration) (*systest.System, *systest.Gateway) {
	sys := secStart(t, systest.Options{Gateway: gateway.Config{
		Policy: gateway.PolicyApp, AppURL: url, AppSubject: subject, AppSecret: appSecret, AppTimeout: timeout,
	}})
	return sys, sys.Gateway()
}

// online connects users to gw and keeps them alive until the test ends.
func online(t *testing.T, gw *systest.Gateway, users ...string) {
	for _, u := range users {
		stop := systest.KeepAlive(secDial(t, gw, u), systest.Heartbeat)
		t.Cleanup(stop)
	}
}

func TestAppPolicyHTTPCallout(t *testing.T) {
	t.Parallel()
	a := newApp([2]string{"alice", "bob"}, [2]string{"alice", "dave"})
	sys, gw := appGateway(t, a.serveHTTP(t), "", 10*time.Second)
	online(t, gw, "bob", "carol")
	al := secDial(t, gw, "alice")
	defer systest.KeepAlive(al, systest.Heartbeat)()

	// One subscribe of three users is one question.
	got := subscribeAll(t, al, "s", "bob", "carol", "dave")
	if u := got.users(); !slices.Equal(u, []string{"bob", "dave"}) {
		t.Errorf("presence_init users = %v, want bob and dave", u)
	}
	if got.denied["carol"] != protocol.ReasonNotAllowed {
		t.Errorf("denied = %v, want carol not_allowed", got.denied)
	}
	if n := a.questions(); n != 1 {
		t.Errorf("%d questions for one subscribe, want 1", n)
	}
	a.mu.Lock()
	if q := a.asked[0]; q.Watcher != "alice" || !slices.Equal(q.Targets, []string{"bob", "carol", "dave"}) {
		t.Errorf("question = %+v", q)
	}
	a.mu.Unlock()

	// The answers are cached: another socket of alice asks nothing.
	al2 := secDial(t, gw, "alice", "second")
	defer systest.KeepAlive(al2, systest.Heartbeat)()
	if got := subscribeAll(t, al2, "s", "bob", "carol"); !slices.Equal(got.users(), []string{"bob"}) {
		t.Errorf("second socket: presence_init users = %v, want bob", got.users())
	}
	if n := a.questions(); n != 1 {
		t.Errorf("%d questions after a cached subscribe, want 1", n)
	}
	if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_authz_cache_lookups_total", "result", "hit"); v < 2 {
		t.Errorf("cache hits = %v, want at least 2", v)
	}
	if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_authz_callouts_total", "transport", "http"); v != 1 {
		t.Errorf("callouts = %v, want 1", v)
	}

	t.Run("invalidation over NATS revokes", func(t *testing.T) {
		a.set("alice", "bob", false)
		if err := sys.NC.Publish(gateway.InvalidateSubject, []byte(`{"watcher":"alice","target":"bob"}`)); err != nil {
			t.Fatal(err)
		}
		if r := awaitRevoked(t, al, "bob"); r != protocol.ReasonNotAllowed {
			t.Errorf("first socket: bob revoked with %q", r)
		}
		if r := awaitRevoked(t, al2, "bob"); r != protocol.ReasonNotAllowed {
			t.Errorf("second socket: bob revoked with %q", r)
		}
		// Dave's answer was not invalidated: still cached, still allowed.
		n := a.questions()
		if got := subscribeAll(t, al, "s2", "dave"); len(got.users()) != 1 {
			t.Errorf("dave after the invalidation: %+v", got)
		}
		if a.questions() != n {
			t.Errorf("dave was asked again: the invalidation dropped more than alice->bob")
		}
	})

	t.Run("invalidation over HTTP revokes", func(t *testing.T) {
		a.set("alice", "dave", false)
		body := []byte(`{}`)
		if st := signedPost(t, gw.HTTP+gateway.InvalidatePath, body, time.Now(), appSecret); st != http.StatusAccepted {
			t.Fatalf("POST invalidate = %d, want 202", st)
		}
		if r := awaitRevoked(t, al, "dave"); r != protocol.ReasonNotAllowed {
			t.Errorf("dave revoked with %q", r)
		}
		// Bad signatures, stale timestamps and bad bodies are refused.
		if st := signedPost(t, gw.HTTP+gateway.InvalidatePath, body, time.Now(), []byte("another secret, also 32 bytes long!")); st != http.StatusUnauthorized {
			t.Errorf("POST with a wrong secret = %d, want 401", st)
		}
		if st := signedPost(t, gw.HTTP+gateway.InvalidatePath, body, time.Now().Add(-10*time.Minute), appSecret); st != http.StatusUnauthorized {
			t.Errorf("POST with a stale timestamp = %d, want 401", st)
		}
		if st := signedPost(t, gw.HTTP+gateway.InvalidatePath, []byte(`{"watcher":"no such id!"}`), time.Now(), appSecret); st != http.StatusBadRequest {
			t.Errorf("POST with a bad user id = %d, want 400", st)
		}
	})

	t.Run("HTTP API", func(t *testing.T) {
		a.set("alice", "carol", true)
		if err := sys.NC.Publish(gateway.InvalidateSubject, []byte(`{"watcher":"alice"}`)); err != nil {
			t.Fatal(err)
		}
		h := bearer(secLongToken(t, "alice"))
		natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			var p presence.Presence
			if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/carol", h, nil, &p); st != http.StatusOK || p.Status != presence.Online {
				return fmt.Errorf("GET carol = %d %+v, want carol online", st, p)
			}
			return nil
		})
		var e apiErr
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob", h, nil, &e); st != http.StatusForbidden || e.Error != protocol.ReasonNotAllowed {
			t.Errorf("GET bob = %d %+v, want 403 not_allowed", st, e)
		}
		var q queryAnswer
		if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", h, map[string]any{"user_ids": []string{"bob", "carol"}}, &q); st != http.StatusOK ||
			len(q.Users) != 1 || q.Users[0].UserID != "carol" || len(q.Denied) != 1 || q.Denied[0].UserID != "bob" {
			t.Errorf("POST query = %d %+v, want carol, and bob denied", st, q)
		}
		var f struct{ Friends []presence.Presence }
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/friends", h, nil, &f); st != http.StatusOK || len(f.Friends) != 1 || f.Friends[0].UserID != "carol" {
			t.Errorf("GET friends = %d %+v, want carol", st, f)
		}
		a.mu.Lock()
		last := a.asked[len(a.asked)-1]
		a.mu.Unlock()
		if !last.List || last.Watcher != "alice" {
			t.Errorf("the friends list asked %+v, want a list question for alice", last)
		}
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/online", h, nil, &e); st != http.StatusForbidden {
			t.Errorf("GET online = %d, want 403", st)
		}
	})
}

// signedPost POSTs body signed with secret at ts, and returns the status.
func signedPost(t *testing.T, url string, body []byte, ts time.Time, secret []byte) int {
	t.Helper()
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(signature.Header, signature.Sign(secret, ts, body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

func TestAppPolicyHTTPFailures(t *testing.T) {
	t.Parallel()
	t.Run("slow app times out", func(t *testing.T) {
		a := newApp([2]string{"alice", "bob"})
		a.fail = func(_ int, _ http.ResponseWriter, r *http.Request) bool {
			<-r.Context().Done()
			return true
		}
		_, gw := appGateway(t, a.serveHTTP(t), "", 500*time.Millisecond)
		online(t, gw, "bob")
		al := secDial(t, gw, "alice")
		defer systest.KeepAlive(al, systest.Heartbeat)()
		if got := subscribeAll(t, al, "s", "bob"); got.denied["bob"] != protocol.ReasonAuthorizationUnavailable {
			t.Errorf("subscribe to a slow app = %+v, want bob authorization_unavailable", got)
		}
		h := bearer(secLongToken(t, "alice"))
		for _, call := range []struct {
			method, path string
			body         any
		}{
			{"GET", "/api/presence/users/bob", nil},
			{"POST", "/api/presence/query", map[string]any{"user_ids": []string{"bob"}}},
			{"GET", "/api/presence/friends", nil},
		} {
			var e apiErr
			if st := apiCall(t, call.method, gw.HTTP+call.path, h, call.body, &e); st != http.StatusServiceUnavailable || e.Error != protocol.ReasonAuthorizationUnavailable {
				t.Errorf("%s %s = %d %+v, want 503 authorization_unavailable", call.method, call.path, st, e)
			}
		}
		if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_authz_callout_errors_total", "transport", "http"); v < 4 {
			t.Errorf("callout errors = %v, want at least 4", v)
		}
	})

	t.Run("500 is refused, not retried", func(t *testing.T) {
		a := newApp([2]string{"alice", "bob"})
		a.fail = func(_ int, w http.ResponseWriter, _ *http.Request) bool {
			http.Error(w, "boom", http.StatusInternalServerError)
			return true
		}
		_, gw := appGateway(t, a.serveHTTP(t), "", 10*time.Second)
		online(t, gw, "bob")
		al := secDial(t, gw, "alice")
		defer systest.KeepAlive(al, systest.Heartbeat)()
		if got := subscribeAll(t, al, "s", "bob"); got.denied["bob"] != protocol.ReasonAuthorizationUnavailable {
			t.Errorf("subscribe = %+v, want bob authorization_unavailable", got)
		}
		if n := a.questions(); n != 1 {
			t.Errorf("%d questions, want 1: a 500 is not retried", n)
		}
		// A refusal is not cached: the app, back, is asked again.
		a.mu.Lock()
		a.fail = nil
		a.mu.Unlock()
		if got := subscribeAll(t, al, "s2", "bob"); len(got.users()) != 1 {
			t.Errorf("subscribe once the app answers = %+v, want bob", got)
		}
	})

	t.Run("503 then an answer is retried", func(t *testing.T) {
		a := newApp([2]string{"alice", "bob"})
		a.fail = func(n int, w http.ResponseWriter, _ *http.Request) bool {
			if n == 1 {
				http.Error(w, "starting", http.StatusServiceUnavailable)
				return true
			}
			return false
		}
		_, gw := appGateway(t, a.serveHTTP(t), "", 10*time.Second)
		online(t, gw, "bob")
		al := secDial(t, gw, "alice")
		defer systest.KeepAlive(al, systest.Heartbeat)()
		if got := subscribeAll(t, al, "s", "bob"); len(got.users()) != 1 {
			t.Errorf("subscribe = %+v, want bob allowed after a retry", got)
		}
		if n := a.questions(); n != 2 {
			t.Errorf("%d requests, want 2 (a 503, then the answer)", n)
		}
	})

	t.Run("bad answer is refused", func(t *testing.T) {
		a := newApp([2]string{"alice", "bob"})
		a.fail = func(_ int, w http.ResponseWriter, _ *http.Request) bool {
			_, _ = io.WriteString(w, `{"allowed":["bob"]}`)
			return true
		}
		_, gw := appGateway(t, a.serveHTTP(t), "", 10*time.Second)
		al := secDial(t, gw, "alice")
		defer systest.KeepAlive(al, systest.Heartbeat)()
		if got := subscribeAll(t, al, "s", "bob"); got.denied["bob"] != protocol.ReasonAuthorizationUnavailable {
			t.Errorf("subscribe = %+v, want bob authorization_unavailable", got)
		}
	})
}

// TestAppSlowerThanANATSRequest: an app allowed to take longer than a
// NATS request (--authz-app-timeout over 10 s) that does not answer gets
// the caller the documented 503 authorization_unavailable, not a
// connection cut by the HTTP server's write deadline.
func TestAppSlowerThanANATSRequest(t *testing.T) {
	t.Parallel()
	a := newApp([2]string{"alice", "bob"})
	a.fail = func(_ int, _ http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done()
		return true
	}
	sys := secStart(t, systest.Options{Gateway: gateway.Config{
		Policy: gateway.PolicyApp, AppURL: a.serveHTTP(t), AppSecret: appSecret,
		AppTimeout: 12 * time.Second, WriteTimeout: time.Second,
	}})
	gw := sys.Gateway()
	online(t, gw, "bob")
	var e apiErr
	st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob", bearer(secLongToken(t, "alice")), nil, &e)
	if st != http.StatusServiceUnavailable || e.Error != protocol.ReasonAuthorizationUnavailable {
		t.Errorf("GET = %d %+v, want 503 authorization_unavailable", st, e)
	}
}

func TestAppPolicyNATSCallout(t *testing.T) {
	t.Parallel()
	t.Run("micro responder", func(t *testing.T) {
		a := newApp([2]string{"alice", "bob"})
		sys, gw := appGateway(t, "", "app.authz", 10*time.Second)
		a.serveNATS(t, sys, "app.authz")
		online(t, gw, "bob", "carol")
		al := secDial(t, gw, "alice")
		defer systest.KeepAlive(al, systest.Heartbeat)()
		got := subscribeAll(t, al, "s", "bob", "carol")
		if !slices.Equal(got.users(), []string{"bob"}) || got.denied["carol"] != protocol.ReasonNotAllowed {
			t.Errorf("subscribe = %+v, want bob, and carol not_allowed", got)
		}
		if n := a.questions(); n != 1 {
			t.Errorf("%d questions, want 1", n)
		}
		var f struct{ Friends []presence.Presence }
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/friends", bearer(secLongToken(t, "alice")), nil, &f); st != http.StatusOK ||
			len(f.Friends) != 1 || f.Friends[0].UserID != "bob" {
			t.Errorf("GET friends = %d %+v, want bob", st, f)
		}
		// The HTTP invalidation is served only with a secret, which this
		// gateway has; the NATS one works either way.
		a.set("alice", "bob", false)
		if err := sys.NC.Publish(gateway.InvalidateSubject, []byte(`{"target":"bob"}`)); err != nil {
			t.Fatal(err)
		}
		if r := awaitRevoked(t, al, "bob"); r != protocol.ReasonNotAllowed {
			t.Errorf("bob revoked with %q", r)
		}
		if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_authz_invalidations_total", "result", "applied"); v != 1 {
			t.Errorf("invalidations applied = %v, want 1", v)
		}
	})

	t.Run("responder that never answers", func(t *testing.T) {
		sys, gw := appGateway(t, "", "app.authz", 500*time.Millisecond)
		svc, err := micro.AddService(sys.NC, micro.Config{
			Name: "authz", Version: "1.0.0",
			Endpoint: &micro.EndpointConfig{Subject: "app.authz", Handler: micro.HandlerFunc(func(micro.Request) {})},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = svc.Stop() }()
		online(t, gw, "bob")
		al := secDial(t, gw, "alice")
		defer systest.KeepAlive(al, systest.Heartbeat)()
		if got := subscribeAll(t, al, "s", "bob"); got.denied["bob"] != protocol.ReasonAuthorizationUnavailable {
			t.Errorf("subscribe = %+v, want bob authorization_unavailable", got)
		}
		var e apiErr
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob", bearer(secLongToken(t, "alice")), nil, &e); st != http.StatusServiceUnavailable ||
			e.Error != protocol.ReasonAuthorizationUnavailable {
			t.Errorf("GET bob = %d %+v, want 503 authorization_unavailable", st, e)
		}
	})
}

// TestAppPolicyLastSeen checks that the target's settings still decide
// last_seen under the app policy, with an allowed watcher as a contact.
func TestAppPolicyLastSeen(t *testing.T) {
	t.Parallel()
	a := newApp([2]string{"alice", "bob"}, [2]string{"alice", "carol"}, [2]string{"alice", "dave"})
	sys, gw := appGateway(t, a.serveHTTP(t), "", 10*time.Second)
	online(t, gw, "bob", "carol", "dave")
	st := map[string]presence.Visibility{"bob": presence.Contacts, "carol": presence.Nobody, "dave": presence.Everyone}
	want := map[string]bool{"bob": true, "carol": false, "dave": true}
	for u, v := range st {
		if err := sys.Store.SetSettings(t.Context(), u, presence.Settings{LastSeen: v}); err != nil {
			t.Fatal(err)
		}
	}
	h := bearer(secLongToken(t, "alice"))
	for u, show := range want {
		var p presence.Presence
		if code := apiCall(t, "GET", gw.HTTP+"/api/presence/users/"+u, h, nil, &p); code != http.StatusOK || (p.LastSeen != 0) != show {
			t.Errorf("GET %s (%s) = %d %+v, want last_seen shown: %v", u, st[u], code, p, show)
		}
	}
}
