package gateway

import (
	"bytes"
	"container/heap"
	"context"
	"fmt"
	"net/textproto"
	"slices"
	"sync"
	"time"

	"github.com/gobwas/ws"
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
// again. At most MaxRegistering upgrades wait for the app at once (apart
// from those being registered); one more is refused with 503 at once.

// connectProxy is the gateway's side of the connect proxy.
type connectProxy struct {
	client  *callout.Client
	timeout time.Duration
	// asking holds a place for each upgrade waiting for the app: at most
	// MaxRegistering, apart from those being registered, so that a slow
	// app holds up neither the upgrades with tokens nor the gateway's
	// other work.
	asking chan struct{}
	// sessions are those of the connections it let in.
	sessions *proxySessions
	// headers are the canonical names of the headers forwarded besides
	// Cookie.
	headers []string
}

// newConnectProxy returns the connect proxy of cfg, nil when it has none.
func newConnectProxy(cfg Config, nc *nats.Conn, m *gatewayMetrics) *connectProxy {
	if !cfg.connectProxy() {
		return nil
	}
	p := &connectProxy{timeout: cfg.ConnectProxyTimeout, asking: make(chan struct{}, cfg.MaxRegistering), sessions: newProxySessions()}
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
// token is, and fills id with its answer (and cr with what is kept of it
// for the refresh). At most MaxRegistering questions wait at once: one
// more is refused with 503 at once.
func (s *Service) askProxy(cr *credentials, id *identity) error {
	select {
	case s.proxy.asking <- struct{}{}:
	default:
		return fmt.Errorf("%w: too many connections waiting for the app to say who they are; retry shortly", ErrUnavailable)
	}
	a, err := s.proxy.client.Connect(context.Background(), &callout.ConnectQuestion{Type: callout.TypeConnect, Headers: cr.forwarded})
	<-s.proxy.asking
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
	id.userID, id.expires = a.UserID, a.Expires
	cr.proxied, cr.session, cr.lifetime = true, a.Session, a.Lifetime
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

// Refresh: the answer's expiry is the connection's, as a token's is (the
// due ring closes it then, with 1008 "session expired"); before it the
// gateway asks the proxy again, naming the user and the session value of
// the last answer, and takes the new answer's expiry and claims as an
// auth renewal takes a new token's. A refusal (the session ended) closes
// the socket with 1008 "session ended". No good answer (the app down or
// slow) keeps the connection until its expiry, asking again meanwhile
// after 1 s, 2 s, 4 s... up to 30 s.

// proxySession is what the connect proxy keeps of a connection it let in.
type proxySession struct {
	session string
	// lifetime is the last answer's expires_in.
	lifetime time.Duration
	expires  time.Time
	// failures counts the refreshes in a row that got no good answer.
	failures int
	// gen tells the session's current refresh from those it replaced.
	gen uint64
}

// refreshItem is a refresh due at at: of a connection's session, in its
// generation gen.
type refreshItem struct {
	at  time.Time
	c   *conn
	gen uint64
}

// refreshHeap holds the refreshes due, earliest first (container/heap):
// a retry goes before most others, which a sorted list would move.
type refreshHeap []refreshItem

func (h refreshHeap) Len() int           { return len(h) }
func (h refreshHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h refreshHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *refreshHeap) Push(x any)        { *h = append(*h, x.(refreshItem)) }
func (h *refreshHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = refreshItem{}
	*h = old[:len(old)-1]
	return it
}

// proxySessions are the sessions of the connections the connect proxy
// let in, and when each is refreshed. It is safe for concurrent use.
type proxySessions struct {
	mu  sync.Mutex
	of  map[*conn]*proxySession
	due refreshHeap
	// stale counts the refreshes in due of sessions forgotten or
	// rescheduled since: once they are half of it, they are dropped, so
	// that an ended connection is let go soon, not at its refresh.
	stale int
	gen   uint64
	wake  chan struct{}
}

// current reports whether it is the refresh its session waits for.
func (p *proxySessions) current(it refreshItem) bool {
	ps := p.of[it.c]
	return ps != nil && ps.gen == it.gen
}

// leftOver counts a stale refresh, and drops the stale ones once they are
// half of those held. The caller holds p.mu.
func (p *proxySessions) leftOver() {
	p.stale++
	if 2*p.stale < len(p.due) {
		return
	}
	p.due = slices.DeleteFunc(p.due, func(it refreshItem) bool { return !p.current(it) })
	heap.Init(&p.due)
	p.stale = 0
}

// take removes and returns the refreshes due by now, and when the next
// one is due (zero when none is).
func (p *proxySessions) take(now time.Time) (due []refreshItem, next time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.due) > 0 && !p.due[0].at.After(now) {
		it := heap.Pop(&p.due).(refreshItem)
		if p.current(it) {
			due = append(due, it)
		} else {
			p.stale = max(p.stale-1, 0)
		}
	}
	if len(p.due) > 0 {
		next = p.due[0].at
	}
	return due, next
}

func newProxySessions() *proxySessions {
	return &proxySessions{of: map[*conn]*proxySession{}, wake: make(chan struct{}, 1)}
}

// The pauses between refreshes that got no good answer.
const (
	refreshRetry    = time.Second
	refreshRetryMax = 30 * time.Second
)

// refreshAt returns when a session of lifetime that expires at exp is
// refreshed: a quarter of its lifetime before, at least twice timeout
// before, but not in the first half of its lifetime.
func refreshAt(exp time.Time, lifetime, timeout time.Duration) time.Time {
	lead := min(max(lifetime/4, 2*timeout), lifetime/2)
	return exp.Add(-lead)
}

// schedule has ps's refresh due at at, replacing any other. The caller
// holds p.mu.
func (p *proxySessions) schedule(c *conn, ps *proxySession, at time.Time) {
	p.gen++
	ps.gen = p.gen
	heap.Push(&p.due, refreshItem{at, c, ps.gen})
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// track keeps the session of c, let in by an answer of lifetime that
// expires at exp, and has it refreshed before then.
func (p *connectProxy) track(c *conn, session string, lifetime time.Duration, exp time.Time) {
	p.sessions.mu.Lock()
	defer p.sessions.mu.Unlock()
	ps := &proxySession{session: session, lifetime: lifetime, expires: exp}
	p.sessions.of[c] = ps
	p.sessions.schedule(c, ps, refreshAt(exp, lifetime, p.timeout))
}

// forget drops the session of c, which ended.
func (p *connectProxy) forget(c *conn) {
	p.sessions.mu.Lock()
	defer p.sessions.mu.Unlock()
	if _, ok := p.sessions.of[c]; ok {
		delete(p.sessions.of, c)
		p.sessions.leftOver()
	}
}

// has reports whether c was let in by the connect proxy.
func (p *connectProxy) has(c *conn) bool {
	p.sessions.mu.Lock()
	defer p.sessions.mu.Unlock()
	_, ok := p.sessions.of[c]
	return ok
}

// refreshSessions refreshes the sessions as they come due, until ctx
// ends, at most MaxRegistering at once.
func (s *Service) refreshSessions(ctx context.Context) {
	p := s.proxy.sessions
	sem := make(chan struct{}, s.cfg.MaxRegistering)
	var running sync.WaitGroup
	defer running.Wait()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		due, next := p.take(time.Now())
		for _, it := range due {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			running.Go(func() {
				defer func() { <-sem }()
				s.refresh(ctx, it)
			})
		}
		if len(due) > 0 {
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-t.C:
		}
	}
}

// refresh asks the connect proxy about a session due for refresh, and
// applies the answer.
func (s *Service) refresh(ctx context.Context, it refreshItem) {
	p, c := s.proxy.sessions, it.c
	p.mu.Lock()
	ps := p.of[c]
	if ps == nil || ps.gen != it.gen || c.closed.Load() {
		p.mu.Unlock()
		return
	}
	q := &callout.ConnectQuestion{Type: callout.TypeRefresh, UserID: c.userID, Session: ps.session}
	p.mu.Unlock()
	a, err := s.proxy.client.Connect(ctx, q)
	if ctx.Err() != nil {
		return
	}
	var (
		watch *authz.WatchList
		rooms *roomGrant
	)
	if err == nil && !a.Refused {
		if a.UserID != c.userID {
			s.log.Warn("connect proxy refresh names another user: the session ends", "user_id", c.userID, "answer_user_id", a.UserID)
			a = callout.ConnectAnswer{Refused: true}
		} else {
			watch, rooms, err = s.proxyGrants(a)
		}
	}
	p.mu.Lock()
	if p.of[c] != ps || ps.gen != it.gen {
		p.mu.Unlock()
		return
	}
	switch {
	case err != nil:
		s.metrics.connectProxyAnswer(callout.TypeRefresh, "failed")
		s.log.Warn("connect proxy refresh", "user_id", c.userID, "err", err)
		pause := min(refreshRetry<<min(ps.failures, 5), refreshRetryMax)
		ps.failures++
		if at := time.Now().Add(pause); at.Before(ps.expires) {
			p.schedule(c, ps, at)
		}
		p.mu.Unlock()
		return
	case a.Refused:
		delete(p.of, c)
		p.mu.Unlock()
		s.metrics.connectProxyAnswer(callout.TypeRefresh, "refused")
		s.end(c, endClean, ws.StatusPolicyViolation, closeSessionEnded)
		return
	}
	s.metrics.connectProxyAnswer(callout.TypeRefresh, "allowed")
	ps.session, ps.lifetime, ps.expires, ps.failures = a.Session, a.Lifetime, a.Expires, 0
	p.schedule(c, ps, refreshAt(a.Expires, a.Lifetime, s.proxy.timeout))
	p.mu.Unlock()
	s.regrant(c, a.Expires, watch, rooms)
}

// The reasons of the closes of the connect proxy's connections.
const (
	closeSessionEnded   = "session ended"
	closeSessionExpired = "session expired"
)
