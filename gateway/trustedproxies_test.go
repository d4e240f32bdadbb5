package gateway_test

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/system/systest"
)

// TestTrustedProxies: behind a trusted proxy (here the test's own
// loopback address), the HTTP API's per-address limit counts each client
// the proxy names apart; a gateway that trusts no proxy counts the
// peer's address, whatever a client's headers say.
func TestTrustedProxies(t *testing.T) {
	t.Parallel()
	limits := gateway.Config{APIAddressRateLimit: 0.01, APIAddressRateBurst: 2}
	from := func(addr string) http.Header { return http.Header{"X-Forwarded-For": {addr}} }

	trusting := limits
	trusting.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	gw := systest.Start(t, systest.Options{Gateway: trusting}).Gateway()
	url := gw.HTTP + "/api/presence/users/bob?user=alice"
	for i := range 2 {
		if st := apiCall(t, "GET", url, from("203.0.113.1"), nil, nil); st == http.StatusTooManyRequests {
			t.Fatalf("request %d of 203.0.113.1: 429 within its burst", i)
		}
	}
	if st := apiCall(t, "GET", url, from("203.0.113.1"), nil, nil); st != http.StatusTooManyRequests {
		t.Errorf("third request of 203.0.113.1: %d, want 429", st)
	}
	if st := apiCall(t, "GET", url, from("203.0.113.2"), nil, nil); st == http.StatusTooManyRequests {
		t.Error("another client behind the proxy was limited with the first")
	}

	gw = systest.Start(t, systest.Options{Gateway: limits}).Gateway()
	url = gw.HTTP + "/api/presence/users/bob?user=alice"
	for i, addr := range []string{"203.0.113.1", "203.0.113.2"} {
		if st := apiCall(t, "GET", url, from(addr), nil, nil); st == http.StatusTooManyRequests {
			t.Fatalf("request %d: 429 within the burst", i)
		}
	}
	if st := apiCall(t, "GET", url, from("203.0.113.3"), nil, nil); st != http.StatusTooManyRequests {
		t.Errorf("a third client naming itself in X-Forwarded-For, to a gateway that trusts no proxy: %d, want 429 (one address)", st)
	}
}
