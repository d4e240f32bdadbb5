package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net/textproto"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/gateway/internal/authz"
	"github.com/greendot/greendot/gateway/internal/callout"
)

// The connect proxy (Config.ConnectProxyURL or ConnectProxySubject) asks
// the app who a client is whose upgrade request carries no token: the
// request's cookies and the headers listed in ConnectProxyHeaders are
// forwarded, signed with AppSecret over HTTP as the app policy's
// questions are, and the app answers with a user id, an expiry and
// optionally the claims a token carries (watch, rooms), which become the
// connection's grants as a token's do; or with a refusal. A request that
// carries a token is verified as without a proxy: the app is not asked.
//
// A refusal answers the upgrade 401, as a bad token; no good answer
// within ConnectProxyTimeout (the app down, slow, failing, answering
// nonsense) answers it 503, and is not remembered: the next upgrade asks
// again. The upgrades waiting for the app count against MaxRegistering,
// as those being registered do.

// connectProxy is the gateway's side of the connect proxy.
type connectProxy struct {
	client *callout.Client
	// headers are the canonical names of the headers forwarded besides
	// Cookie.
	headers []string
}

// newConnectProxy returns the connect proxy of cfg, nil when it has none.
func newConnectProxy(cfg Config, nc *nats.Conn, m *gatewayMetrics) *connectProxy {
	if !cfg.connectProxy() {
		return nil
	}
	p := &connectProxy{}
	for _, h := range cfg.ConnectProxyHeaders {
		p.headers = append(p.headers, textproto.CanonicalMIMEHeaderKey(h))
	}
	switch {
	case cfg.ConnectProxyURL != "":
		p.client = callout.NewHTTP(callout.HTTPConfig{
			URL: cfg.ConnectProxyURL, Secret: cfg.AppSecret, Timeout: cfg.ConnectProxyTimeout, Observe: m.connectProxyCall,
		})
	default:
		p.client = callout.NewNATS(callout.NATSConfig{
			Conn: nc, Subject: cfg.ConnectProxySubject, Timeout: cfg.ConnectProxyTimeout, Observe: m.connectProxyCall,
		})
	}
	return p
}

// forward keeps a header of an upgrade request in cr.forwarded when it is
// one the proxy forwards: the values of a repeated header are joined, as
// RFC 9110 has it ("; " for Cookie).
func (p *connectProxy) forward(cr *credentials, key, value []byte) {
	name, sep := "Cookie", "; "
	if !bytes.EqualFold(key, []byte(name)) {
		name, sep = "", ", "
		for _, h := range p.headers {
			if bytes.EqualFold(key, []byte(h)) {
				name = h
				break
			}
		}
		if name == "" {
			return
		}
	}
	if cr.forwarded == nil {
		cr.forwarded = make(map[string]string, 1+len(p.headers))
	}
	if old, ok := cr.forwarded[name]; ok {
		cr.forwarded[name] = old + sep + string(value)
	} else {
		cr.forwarded[name] = string(value)
	}
}

// errProxyUnavailable refuses an upgrade the connect proxy gave no good
// answer for; the operator reads why in the log.
var errProxyUnavailable = fmt.Errorf("%w: the app could not say who you are right now; try again", ErrUnavailable)

// askProxy asks the connect proxy who the client of an upgrade without a
// token is, and fills id with its answer. The question holds a place
// among the MaxRegistering upgrades being registered while it waits.
func (s *Service) askProxy(cr *credentials, id *identity) error {
	select {
	case s.regSem <- struct{}{}:
	default:
		return fmt.Errorf("%w: too many connections being registered; retry shortly", ErrUnavailable)
	}
	a, err := s.proxy.client.Connect(context.Background(), &callout.ConnectQuestion{Type: callout.TypeConnect, Headers: cr.forwarded})
	<-s.regSem
	if err == nil && !a.Refused {
		id.watch, id.rooms, err = s.proxyGrants(a)
	}
	switch {
	case err != nil:
		s.metrics.connectProxyAnswer(callout.TypeConnect, "failed")
		s.log.Warn("connect proxy", "err", err)
		return errProxyUnavailable
	case a.Refused:
		s.metrics.connectProxyAnswer(callout.TypeConnect, "refused")
		return fmt.Errorf("%w: the app refused the session (connect proxy): sign in again", ErrUnauthorized)
	}
	s.metrics.connectProxyAnswer(callout.TypeConnect, "allowed")
	id.userID, id.expires, id.session = a.UserID, a.Expires, a.Session
	return nil
}

// proxyGrants turns the claims of a connect proxy's answer into the grants
// of a connection, as a token's claims are: the watch claim under
// PolicyToken (at most TokenMaxWatch user ids: more is a bad answer), the
// rooms claim always.
func (s *Service) proxyGrants(a callout.ConnectAnswer) (*authz.WatchList, *roomGrant, error) {
	var watch *authz.WatchList
	if s.cfg.Policy == PolicyToken {
		if len(a.Watch) > s.cfg.TokenMaxWatch {
			return nil, nil, fmt.Errorf("connect proxy answer: the watch claim lists %d user ids, over the limit: %s", len(a.Watch), s.watchLimit())
		}
		watch = authz.NewWatchList(a.Watch)
	}
	return watch, newRoomGrant(a.Rooms), nil
}
