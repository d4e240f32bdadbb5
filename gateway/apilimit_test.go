package gateway_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/system/systest"
)

// apiAnswer is what TestAPIRateLimit reads of an HTTP API answer.
type apiAnswer struct {
	status     int
	retryAfter string
	err        apiErr
	header     http.Header
}

// apiFrom sends GET /api/presence/users/bob with the headers h from the
// source address src.
func apiFrom(t *testing.T, gw *systest.Gateway, src string, h http.Header) apiAnswer {
	t.Helper()
	req, err := http.NewRequest("GET", gw.HTTP+"/api/presence/users/bob", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	return sendFrom(t, src, req)
}

// sendFrom sends req from the source address src.
func sendFrom(t *testing.T, src string, req *http.Request) apiAnswer {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       d.DialContext,
		DisableKeepAlives: true,
	}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s from %s: %v", req.Method, req.URL.Path, src, err)
	}
	defer resp.Body.Close()
	a := apiAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), header: resp.Header}
	if resp.StatusCode >= 300 {
		if err := json.NewDecoder(resp.Body).Decode(&a.err); err != nil {
			t.Fatalf("%s %s from %s: %d with a body that is not an error: %v", req.Method, req.URL.Path, src, resp.StatusCode, err)
		}
	}
	return a
}

// The HTTP API limits each identity, and each source address before it
// authenticates anyone, answering 429 with Retry-After; one client over
// its limit does not limit the others.
func TestAPIRateLimit(t *testing.T) {
	t.Parallel()
	// About one request in 100 s comes back: no token refills during the
	// test however slow the machine, and Retry-After says 100.
	sys := secStart(t, systest.Options{Gateway: gateway.Config{
		Policy:       gateway.PolicyEveryone,
		APIRateLimit: 0.01, APIRateBurst: 2,
		APIAddressRateLimit: 0.01, APIAddressRateBurst: 5,
	}})
	gw := sys.Gateways[0]
	alice, bob := bearer(secLongToken(t, "alice")), bearer(secLongToken(t, "bob"))
	limited := func(a apiAnswer, who string) {
		t.Helper()
		if a.status != http.StatusTooManyRequests || a.err.Error != protocol.CodeRateLimited || a.retryAfter != "100" || !strings.Contains(a.err.Message, who) {
			t.Errorf("%+v, want 429 rate_limited naming %q with Retry-After 100", a, who)
		}
	}

	// Address 127.0.0.1: five requests in all.
	for i := range 2 {
		if a := apiFrom(t, gw, "127.0.0.1", alice); a.status != http.StatusOK {
			t.Fatalf("alice's request %d of her burst: %+v", i+1, a)
		}
	}
	limited(apiFrom(t, gw, "127.0.0.1", alice), "user alice")
	if a := apiFrom(t, gw, "127.0.0.1", bob); a.status != http.StatusOK {
		t.Errorf("bob limited by alice's requests: %+v", a)
	}
	// A bad token is answered 401 and counts against its address: a flood
	// of them is limited before any is verified.
	if a := apiFrom(t, gw, "127.0.0.1", bearer("not-a-token")); a.status != http.StatusUnauthorized {
		t.Errorf("bad token: %+v, want 401", a)
	}
	limited(apiFrom(t, gw, "127.0.0.1", bob), "this address")

	// Another address has a bucket of its own; alice is still limited
	// there, bob is not.
	if a := apiFrom(t, gw, "127.0.0.2", bob); a.status != http.StatusOK {
		t.Errorf("bob from 127.0.0.2: %+v, want 200", a)
	}
	limited(apiFrom(t, gw, "127.0.0.2", alice), "user alice")

	if v := metricValue(t, gw, "greendot_gateway_api_rate_limited_total", map[string]string{"by": "identity"}); v != 2 {
		t.Errorf("identity refusals counted = %v, want 2", v)
	}
	if v := metricValue(t, gw, "greendot_gateway_api_rate_limited_total", map[string]string{"by": "address"}); v != 1 {
		t.Errorf("address refusals counted = %v, want 1", v)
	}
	// The WebSocket is not the HTTP API: alice still connects.
	secDial(t, gw, "alice")
}

// A browser page of an allowed origin may read every answer of the API,
// its refusals included: a 429 of either limit carries the CORS headers,
// and lets the page read its Retry-After; so does a 400 for a malformed
// query string.
func TestAPIRefusalsReadableFromAllowedOrigin(t *testing.T) {
	t.Parallel()
	const origin = "https://app.example.com"
	sys := secStart(t, systest.Options{Gateway: gateway.Config{
		Policy:         gateway.PolicyEveryone,
		AllowedOrigins: []string{origin},
		APIRateLimit:   0.01, APIRateBurst: 1,
		APIAddressRateLimit: 0.01, APIAddressRateBurst: 3,
	}})
	gw := sys.Gateway()
	from := func(user string) http.Header {
		h := bearer(secLongToken(t, user))
		h.Set("Origin", origin)
		return h
	}
	readable := func(a apiAnswer, status int, what string) {
		t.Helper()
		acao, expose := a.header.Get("Access-Control-Allow-Origin"), a.header.Get("Access-Control-Expose-Headers")
		if a.status != status || acao != origin || !strings.Contains(expose, "Retry-After") {
			t.Errorf("%s: %d, Access-Control-Allow-Origin %q, Access-Control-Expose-Headers %q; want %d readable by %s, Retry-After too",
				what, a.status, acao, expose, status, origin)
		}
	}
	readable(apiFrom(t, gw, "127.0.0.1", from("alice")), http.StatusOK, "alice's first request")
	readable(apiFrom(t, gw, "127.0.0.1", from("alice")), http.StatusTooManyRequests, "alice over her limit")
	req, err := http.NewRequest("GET", gw.HTTP+"/api/presence/users/bob?user=%zz", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = from("bob")
	readable(sendFrom(t, "127.0.0.1", req), http.StatusBadRequest, "a malformed query string")
	readable(apiFrom(t, gw, "127.0.0.1", from("bob")), http.StatusTooManyRequests, "bob over the address's limit")
}

// invalidateFrom POSTs an invalidation of every answer, signed with
// secret, from the source address src.
func invalidateFrom(t *testing.T, gw *systest.Gateway, src string, secret []byte) apiAnswer {
	t.Helper()
	body := []byte(`{}`)
	req, err := http.NewRequest("POST", gw.HTTP+gateway.InvalidatePath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(signature.Header, signature.Sign(secret, time.Now(), body))
	return sendFrom(t, src, req)
}

// POST /api/authz/invalidate is limited per source address, like the rest
// of the API, before its signature is checked: a flood of badly signed
// invalidations costs little.
func TestAPIRateLimitInvalidate(t *testing.T) {
	t.Parallel()
	// About one request in 100 s comes back: no token refills during the
	// test however slow the machine, and Retry-After says 100.
	sys := secStart(t, systest.Options{Gateway: gateway.Config{
		Policy: gateway.PolicyApp, AppSubject: "app.authz", AppSecret: appSecret,
		APIAddressRateLimit: 0.01, APIAddressRateBurst: 2,
	}})
	gw := sys.Gateway()
	if a := invalidateFrom(t, gw, "127.0.0.1", appSecret); a.status != http.StatusAccepted {
		t.Fatalf("a valid invalidation within the limit: %+v, want 202", a)
	}
	if a := invalidateFrom(t, gw, "127.0.0.1", []byte("another secret, also 32 bytes long!")); a.status != http.StatusUnauthorized {
		t.Errorf("a badly signed invalidation within the limit: %+v, want 401", a)
	}
	a := invalidateFrom(t, gw, "127.0.0.1", appSecret)
	if a.status != http.StatusTooManyRequests || a.err.Error != protocol.CodeRateLimited || a.retryAfter != "100" || !strings.Contains(a.err.Message, "this address") {
		t.Errorf("a valid invalidation over the limit: %+v, want 429 rate_limited with Retry-After 100", a)
	}
	// Another address has a bucket of its own.
	if a := invalidateFrom(t, gw, "127.0.0.2", appSecret); a.status != http.StatusAccepted {
		t.Errorf("a valid invalidation from 127.0.0.2: %+v, want 202", a)
	}
	if v := metricValue(t, gw, "greendot_gateway_api_rate_limited_total", map[string]string{"by": "address"}); v != 1 {
		t.Errorf("address refusals counted = %v, want 1", v)
	}
}
