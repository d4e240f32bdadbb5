package gateway

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientAddress returns the address a request came from: its peer's,
// unless the peer is one of trusted (a load balancer or reverse proxy of
// the deployment's), whose Forwarded (RFC 7239) or, without it,
// X-Forwarded-For header then says: the nearest address in it that is not
// trusted, walking back from the peer, as a proxy chain appends each hop.
// A header that cannot be read is not believed. A peer not trusted is
// never believed: its headers may say anything.
func clientAddress(r *http.Request, trusted []netip.Prefix) string {
	peer := r.RemoteAddr
	if host, _, err := net.SplitHostPort(peer); err == nil {
		peer = host
	}
	if len(trusted) == 0 {
		return peer
	}
	ip, err := netip.ParseAddr(peer)
	if err != nil || !isTrusted(ip, trusted) {
		return peer
	}
	hops, ok := forwardedFor(r.Header)
	if !ok {
		return peer
	}
	for i := len(hops) - 1; i >= 0; i-- {
		if !isTrusted(hops[i], trusted) {
			return hops[i].String()
		}
	}
	if len(hops) > 0 {
		return hops[0].String()
	}
	return peer
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	ip = ip.Unmap()
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// forwardedFor returns the addresses of a request's Forwarded header's
// for= parameters, or else of its X-Forwarded-For header, in order, and
// whether there was one that could be read whole.
func forwardedFor(h http.Header) ([]netip.Addr, bool) {
	if fwd := h.Values("Forwarded"); len(fwd) > 0 {
		var hops []netip.Addr
		for _, elem := range strings.Split(strings.Join(fwd, ","), ",") {
			for _, pair := range strings.Split(elem, ";") {
				k, v, found := strings.Cut(strings.TrimSpace(pair), "=")
				if !found || !strings.EqualFold(k, "for") {
					continue
				}
				ip, ok := parseNode(strings.Trim(v, `"`))
				if !ok {
					return nil, false
				}
				hops = append(hops, ip)
			}
		}
		return hops, len(hops) > 0
	}
	xff := h.Values("X-Forwarded-For")
	if len(xff) == 0 {
		return nil, false
	}
	var hops []netip.Addr
	for _, part := range strings.Split(strings.Join(xff, ","), ",") {
		ip, ok := parseNode(strings.TrimSpace(part))
		if !ok {
			return nil, false
		}
		hops = append(hops, ip)
	}
	return hops, true
}

// parseNode parses an address as the headers give one: 192.0.2.1,
// 192.0.2.1:4711, 2001:db8::1, [2001:db8::1] or [2001:db8::1]:4711.
func parseNode(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}
