package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// checkHost refuses, under dev auth, a request whose Host names this
// machine by a name other than localhost, a name under .localhost and
// those of Config.DevAuthHosts. A web page of any site may make a browser
// connect to a developer's gateway, and with dev auth act as any user:
// the Origin rule stops a page of another site, but not one whose name
// its site made point to this machine (DNS rebinding), which is then the
// same site for the browser. The page's name is the request's Host, so
// the Host must be one no other site can have. An IP address names no
// site, and an empty Host comes from no browser: both pass.
func (s *Service) checkHost(host string) error {
	if !s.cfg.DevAuth || host == "" {
		return nil
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	if _, err := netip.ParseAddr(name); err == nil {
		return nil
	}
	name = strings.ToLower(name)
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return nil
	}
	for _, h := range s.cfg.DevAuthHosts {
		if strings.EqualFold(h, name) {
			return nil
		}
	}
	return fmt.Errorf("%w: %q: with dev auth on, a request must name this machine by localhost, an IP address "+
		"or a name of --dev-auth-hosts, so that a web page of another site cannot act as any user", ErrForbiddenHost, host)
}

// refuseOtherHosts has h answer only the requests checkHost passes; the
// others are refused with 403 forbidden_host.
func (s *Service) refuseOtherHosts(h http.Handler) http.Handler {
	if !s.cfg.DevAuth {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.checkHost(r.Host); err != nil {
			writeError(w, httpStatus(err), errorCode(err), err.Error())
			return
		}
		h.ServeHTTP(w, r)
	})
}
