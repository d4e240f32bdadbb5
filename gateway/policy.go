package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// authorizer decides who may watch whom and who may see whose last_seen,
// from the follow edges and privacy settings in presence_graph. It caches
// what it reads for at most AuthzCacheTTL, and a watcher on the graph
// bucket drops cached entries as soon as they change, and re-checks the
// subscriptions a change affects. It is safe for concurrent use.
type authorizer struct {
	s *Service

	mu       sync.Mutex
	edges    map[string]cachedBool // follow key -> it exists
	settings map[string]cachedSettings
}

type cachedBool struct {
	v  bool
	at time.Time
}

type cachedSettings struct {
	v  presence.Settings
	at time.Time
}

// maxCacheEntries bounds each cache; a full cache is emptied.
const maxCacheEntries = 200_000

func newAuthorizer(s *Service) *authorizer {
	return &authorizer{
		s:        s,
		edges:    make(map[string]cachedBool),
		settings: make(map[string]cachedSettings),
	}
}

// decision is what the authorizer says about one watcher and one target.
type decision struct {
	allowed  bool
	reason   string // the denial reason when not allowed
	lastSeen bool   // the watcher may see the target's last_seen
}

// decide says whether watcher may watch target under the gateway's policy,
// and whether it may see target's last_seen.
func (a *authorizer) decide(ctx context.Context, watcher, target string) (decision, error) {
	if watcher == target {
		return decision{allowed: true, lastSeen: true}, nil
	}
	// The target follows the watcher: the watcher is one of the target's
	// contacts, for last_seen and for the mutual policy.
	back, err := a.follows(ctx, target, watcher)
	if err != nil {
		return decision{}, err
	}
	var d decision
	switch a.s.cfg.Policy {
	case PolicyEveryone:
		d.allowed = true
	case PolicyFollow:
		fwd, err := a.follows(ctx, watcher, target)
		if err != nil {
			return decision{}, err
		}
		d.allowed, d.reason = fwd, protocol.ReasonNotFollowing
	default:
		fwd := false
		if back {
			if fwd, err = a.follows(ctx, watcher, target); err != nil {
				return decision{}, err
			}
		}
		d.allowed, d.reason = fwd && back, protocol.ReasonNotMutualFollowers
	}
	if !d.allowed {
		return d, nil
	}
	d.reason = ""
	d.lastSeen, err = a.lastSeen(ctx, target, back)
	return d, err
}

// lastSeen reports whether a watcher may see target's last_seen; contact
// says whether target follows the watcher.
func (a *authorizer) lastSeen(ctx context.Context, target string, contact bool) (bool, error) {
	st, err := a.settingsOf(ctx, target)
	if err != nil {
		return false, err
	}
	return st.ShowLastSeen(false, contact), nil
}

// follows reports whether x follows y.
func (a *authorizer) follows(ctx context.Context, x, y string) (bool, error) {
	key := presence.FollowKey(x, y)
	now := time.Now()
	a.mu.Lock()
	e, ok := a.edges[key]
	a.mu.Unlock()
	if ok && now.Sub(e.at) < a.s.cfg.AuthzCacheTTL {
		return e.v, nil
	}
	v, err := a.s.store.Follows(ctx, x, y)
	if err != nil {
		return false, err
	}
	a.mu.Lock()
	if len(a.edges) >= maxCacheEntries {
		clear(a.edges)
	}
	a.edges[key] = cachedBool{v, now}
	a.mu.Unlock()
	return v, nil
}

// settingsOf returns a user's privacy settings.
func (a *authorizer) settingsOf(ctx context.Context, userID string) (presence.Settings, error) {
	now := time.Now()
	a.mu.Lock()
	e, ok := a.settings[userID]
	a.mu.Unlock()
	if ok && now.Sub(e.at) < a.s.cfg.AuthzCacheTTL {
		return e.v, nil
	}
	v, err := a.s.store.Settings(ctx, userID)
	if err != nil {
		return presence.Settings{}, err
	}
	a.mu.Lock()
	if len(a.settings) >= maxCacheEntries {
		clear(a.settings)
	}
	a.settings[userID] = cachedSettings{v, now}
	a.mu.Unlock()
	return v, nil
}

// start watches presence_graph until ctx is canceled, in a goroutine.
func (a *authorizer) start(ctx context.Context) error {
	w, err := a.s.store.WatchGraph(ctx)
	if err != nil {
		return err
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil {
					a.changed(ctx, e)
				}
			}
		}
	}()
	return nil
}

// changed applies one change of the graph bucket: it forgets what was
// cached and re-checks the subscriptions it may affect.
func (a *authorizer) changed(ctx context.Context, e jetstream.KeyValueEntry) {
	if x, y, ok := presence.ParseFollowKey(e.Key()); ok {
		a.mu.Lock()
		delete(a.edges, e.Key())
		a.mu.Unlock()
		// x -> y decides whether x may watch y (every policy but
		// everyone), whether y may watch x (mutual), and whether y may
		// see x's last_seen (contacts).
		a.recheck(ctx, x, y)
		a.recheck(ctx, y, x)
		return
	}
	if u, ok := presence.ParseSettingsKey(e.Key()); ok {
		a.mu.Lock()
		delete(a.settings, u)
		a.mu.Unlock()
		for _, c := range a.s.hub.watchersOf(u) {
			a.recheckConn(ctx, c, u)
		}
	}
}

// recheck re-decides the subscriptions of watcher's sockets to target.
func (a *authorizer) recheck(ctx context.Context, watcher, target string) {
	for _, c := range a.s.hub.userConns(watcher) {
		if a.s.hub.watching(c, target) {
			a.recheckConn(ctx, c, target)
		}
	}
}

// recheckConn re-decides c's subscription to target: a subscription no
// longer allowed ends with a denied frame; a change of last_seen
// visibility sends the target's presence as the watcher may now see it.
func (a *authorizer) recheckConn(ctx context.Context, c *conn, target string) {
	d, err := a.decide(ctx, c.userID, target)
	if err != nil {
		a.s.log.Warn("recheck subscription", "user_id", c.userID, "target", target, "err", err)
		return
	}
	if !d.allowed {
		a.s.hub.unsubscribe(c, []string{target})
		c.sendDenied("", target, d.reason)
		return
	}
	if a.s.hub.setLastSeen(c, target, d.lastSeen) {
		c.resend(ctx, target)
	}
}

// showLastSeen reports whether watcher may see target's last_seen. An error
// reading the graph hides it.
func (s *Service) showLastSeen(ctx context.Context, watcher, target string) bool {
	if watcher == target {
		return true
	}
	back, err := s.authz.follows(ctx, target, watcher)
	if err != nil {
		return false
	}
	show, err := s.authz.lastSeen(ctx, target, back)
	return show && err == nil
}
