package gateway

import (
	"net/http"
	"net/netip"
	"testing"
)

func TestClientAddress(t *testing.T) {
	t.Parallel()
	lb := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, tc := range []struct {
		name    string
		peer    string
		trusted []netip.Prefix
		headers map[string][]string
		want    string
	}{
		{"no proxies trusted", "198.51.100.7:5000", nil, map[string][]string{"X-Forwarded-For": {"203.0.113.1"}}, "198.51.100.7"},
		{"a forged header from a client", "198.51.100.7:5000", lb, map[string][]string{"X-Forwarded-For": {"203.0.113.1"}}, "198.51.100.7"},
		{"through the load balancer", "10.0.0.2:5000", lb, map[string][]string{"X-Forwarded-For": {"203.0.113.1"}}, "203.0.113.1"},
		{"a client's forged hop before the balancer's", "10.0.0.2:5000", lb, map[string][]string{"X-Forwarded-For": {"192.0.2.66, 203.0.113.1"}}, "203.0.113.1"},
		{"two proxies of ours", "10.0.0.2:5000", lb, map[string][]string{"X-Forwarded-For": {"203.0.113.1, 10.1.2.3"}}, "203.0.113.1"},
		{"headers repeated", "10.0.0.2:5000", lb, map[string][]string{"X-Forwarded-For": {"192.0.2.66", "203.0.113.1,10.1.2.3"}}, "203.0.113.1"},
		{"every hop ours", "10.0.0.2:5000", lb, map[string][]string{"X-Forwarded-For": {"10.9.9.9, 10.1.2.3"}}, "10.9.9.9"},
		{"no header", "10.0.0.2:5000", lb, nil, "10.0.0.2"},
		{"a header not an address", "10.0.0.2:5000", lb, map[string][]string{"X-Forwarded-For": {"203.0.113.1, unknown"}}, "10.0.0.2"},
		{"Forwarded", "10.0.0.2:5000", lb, map[string][]string{"Forwarded": {`for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"`}}, "2001:db8:cafe::17"},
		{"Forwarded before X-Forwarded-For", "[fd00::5]:5000", lb, map[string][]string{"Forwarded": {"for=203.0.113.9"}, "X-Forwarded-For": {"192.0.2.66"}}, "203.0.113.9"},
		{"Forwarded obfuscated", "10.0.0.2:5000", lb, map[string][]string{"Forwarded": {"for=_hidden"}}, "10.0.0.2"},
		{"an IPv4-mapped hop", "10.0.0.2:5000", lb, map[string][]string{"X-Forwarded-For": {"::ffff:203.0.113.1"}}, "203.0.113.1"},
	} {
		r := &http.Request{RemoteAddr: tc.peer, Header: http.Header(tc.headers)}
		if got := clientAddress(r, tc.trusted); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
