package authz

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/protocol"
)

// AppSource asks the app who may watch whom (the app policy). Its
// implementations are the gateway's callouts, over HTTP or NATS.
type AppSource interface {
	// Allowed asks, in one question, which of targets watcher may watch,
	// and returns those allowed. An error means the app did not answer,
	// or not well: nothing is allowed then.
	Allowed(ctx context.Context, watcher string, targets []string) ([]string, error)
	// List asks for the users watcher may watch (its friends list), at
	// most max of them.
	List(ctx context.Context, watcher string, max int) ([]string, error)
}

// ErrAppUnavailable means the app did not answer a question, or answered
// badly; what it was asked about is not allowed.
var ErrAppUnavailable = errors.New("the app did not answer the authorization question")

// WatchList is the watch claim of a token: the users its subject may
// watch under the token policy. It does not change once made; a nil list
// allows nobody.
type WatchList struct {
	ids []string
	set map[string]struct{}
}

// NewWatchList returns the list of ids (valid user ids), without
// duplicates, in their order.
func NewWatchList(ids []string) *WatchList {
	l := &WatchList{set: make(map[string]struct{}, len(ids))}
	for _, u := range ids {
		if _, dup := l.set[u]; !dup {
			l.set[u] = struct{}{}
			l.ids = append(l.ids, u)
		}
	}
	return l
}

// Allows reports whether the list holds user.
func (l *WatchList) Allows(user string) bool {
	if l == nil {
		return false
	}
	_, ok := l.set[user]
	return ok
}

// Len returns how many users the list holds.
func (l *WatchList) Len() int {
	if l == nil {
		return 0
	}
	return len(l.ids)
}

// ListHolder is a watcher that carries a watch list (a socket whose
// token has one). The list may change, on a token refresh; Recheck then
// re-decides the watcher's subscriptions.
type ListHolder interface {
	WatchList() *WatchList
}

type listKey struct{}

// WithWatchList returns a context carrying the watch list of the watcher
// whose questions are decided with it (an HTTP request's token).
func WithWatchList(ctx context.Context, l *WatchList) context.Context {
	return context.WithValue(ctx, listKey{}, l)
}

// watchListOf returns the watch list ctx carries; nil if none.
func watchListOf(ctx context.Context) *WatchList {
	l, _ := ctx.Value(listKey{}).(*WatchList)
	return l
}

// withListOf returns ctx carrying w's watch list, when w has one.
func withListOf(ctx context.Context, w hub.Watcher) context.Context {
	if h, ok := w.(ListHolder); ok {
		return WithWatchList(ctx, h.WatchList())
	}
	return ctx
}

// pair is a watcher and a target, the key of a cached answer of the app.
type pair struct{ watcher, target string }

// decideExternal decides every target for watcher under the token or the
// app policy. What the app did not answer is refused with
// ReasonAuthorizationUnavailable. Every refusal is made before the reads
// of settings, so it holds even when one of those fails.
func (a *Authorizer) decideExternal(ctx context.Context, watcher string, targets []string) ([]Decision, error) {
	allowed := make([]bool, len(targets))
	out := make([]Decision, len(targets))
	switch a.cfg.Policy {
	case Token:
		list := watchListOf(ctx)
		for i, t := range targets {
			allowed[i] = t == watcher || list.Allows(t)
		}
	case App:
		a.askApp(ctx, watcher, targets, allowed, out)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, t := range targets {
		if !allowed[i] {
			if out[i].Reason == "" {
				out[i].Reason = protocol.ReasonNotAllowed
			}
			continue
		}
		g.Go(func() error {
			// A watcher the app allows counts as a contact of the
			// target.
			show, err := a.lastSeen(gctx, t, true)
			out[i] = Decision{Allowed: true, LastSeen: show || t == watcher}
			return err
		})
	}
	return out, g.Wait()
}

// askApp fills allowed with the app's answers for watcher and targets:
// those cached, and those not, asked in one question. What the app did not
// answer gets ReasonAuthorizationUnavailable in out.
func (a *Authorizer) askApp(ctx context.Context, watcher string, targets []string, allowed []bool, out []Decision) {
	now := time.Now()
	var ask []string
	var at []int
	a.mu.Lock()
	gen := a.gen
	for i, t := range targets {
		if t == watcher {
			allowed[i] = true
			continue
		}
		e, ok := a.answers[pair{watcher, t}]
		hit := ok && now.Sub(e.at) < a.cfg.AppCacheTTL
		if a.cfg.CacheLookup != nil {
			a.cfg.CacheLookup(hit)
		}
		if hit {
			allowed[i] = e.v
			continue
		}
		ask = append(ask, t)
		at = append(at, i)
	}
	a.mu.Unlock()
	if len(ask) == 0 {
		return
	}
	yes, err := a.cfg.App.Allowed(ctx, watcher, ask)
	if err != nil {
		a.cfg.Logger.Warn("ask the app", "user_id", watcher, "targets", len(ask), "err", err)
		for _, i := range at {
			out[i].Reason = protocol.ReasonAuthorizationUnavailable
		}
		return
	}
	set := make(map[string]bool, len(yes))
	for _, u := range yes {
		set[u] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	keep := a.gen == gen
	if keep && len(a.answers)+len(ask) > maxCacheEntries {
		clear(a.answers)
	}
	for k, t := range ask {
		allowed[at[k]] = set[t]
		if keep {
			a.answers[pair{watcher, t}] = cached[bool]{set[t], now}
		}
	}
}

// friendsExternal returns the users user may watch under the token or the
// app policy (the first max), with whether it may see each one's
// last_seen.
func (a *Authorizer) friendsExternal(ctx context.Context, user string, max int) ([]hub.Grant, error) {
	var ids []string
	switch a.cfg.Policy {
	case Token:
		if l := watchListOf(ctx); l != nil {
			ids = l.ids
		}
	case App:
		var err error
		if ids, err = a.listApp(ctx, user, max); err != nil {
			return nil, err
		}
	}
	var targets []string
	for _, u := range ids {
		if u != user && len(targets) < max {
			targets = append(targets, u)
		}
	}
	grants := make([]hub.Grant, len(targets))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, u := range targets {
		g.Go(func() error {
			show, err := a.lastSeen(gctx, u, true)
			grants[i] = hub.Grant{User: u, LastSeen: show}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return grants, nil
}

// listApp asks the app for the users user may watch (at most max), and
// caches them as allowed, as askApp caches its answers: not when an
// invalidation (or a graph change) landed while the app was asked, since
// the list may predate it and would outlive it by AppCacheTTL.
func (a *Authorizer) listApp(ctx context.Context, user string, max int) ([]string, error) {
	now := time.Now()
	a.mu.Lock()
	gen := a.gen
	a.mu.Unlock()
	ids, err := a.cfg.App.List(ctx, user, max)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAppUnavailable, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gen != gen {
		return ids, nil
	}
	if len(a.answers)+len(ids) > maxCacheEntries {
		clear(a.answers)
	}
	for _, u := range ids {
		a.answers[pair{user, u}] = cached[bool]{true, now}
	}
	return ids, nil
}

// Invalidate drops the cached answers of the app that match watcher and
// target (an empty one matches anyone), and re-decides the live
// subscriptions they match: those now refused end, as after a graph
// change. The gateway calls it for every invalidation the app sends, from
// one goroutine.
func (a *Authorizer) Invalidate(ctx context.Context, watcher, target string) {
	match := func(w, t string) bool {
		return (watcher == "" || w == watcher) && (target == "" || t == target)
	}
	a.mu.Lock()
	for k := range a.answers {
		if match(k.watcher, k.target) {
			delete(a.answers, k)
		}
	}
	a.gen++
	a.touchLocked(func(t *ticket, u string) bool { return match(t.watcher, u) })
	a.mu.Unlock()

	var ws []hub.Watcher
	switch {
	case watcher != "":
		ws = a.cfg.SocketsOf(watcher)
	case target != "":
		ws = a.cfg.Hub.WatchersOf(target)
	default:
		ws = a.cfg.Hub.Watchers()
	}
	var again showing
	for _, w := range ws {
		var targets []string
		for _, u := range a.cfg.Hub.WatchedBy(w) {
			if match(w.UserID(), u) {
				targets = append(targets, u)
			}
		}
		a.recheckAll(ctx, w, targets, &again)
	}
	a.show(&again)
}

// Recheck re-decides every subscription of w, after its watch list
// changed (a token refresh): those no longer allowed end.
func (a *Authorizer) Recheck(ctx context.Context, w hub.Watcher) {
	user := w.UserID()
	a.mu.Lock()
	a.touchLocked(func(t *ticket, _ string) bool { return t.watcher == user })
	a.mu.Unlock()
	var again showing
	a.recheckAll(ctx, w, a.cfg.Hub.WatchedBy(w), &again)
	a.show(&again)
}

// recheckAll re-decides w's subscriptions to targets, in one question
// under the app policy. When a read of settings fails, the targets no
// longer allowed end all the same (their refusal needs no such read); the
// others are tried again later. The targets w is to be shown again are
// gathered in again.
func (a *Authorizer) recheckAll(ctx context.Context, w hub.Watcher, targets []string, again *showing) {
	if len(targets) == 0 {
		return
	}
	keys := make([]retryKey, len(targets))
	before := make([]uint64, len(targets))
	a.mu.Lock()
	for i, t := range targets {
		keys[i] = retryKey{w, t}
		before[i] = a.retries[keys[i]]
	}
	a.mu.Unlock()
	ds, err := a.DecideAll(withListOf(ctx, w), w.UserID(), targets)
	if err != nil {
		a.cfg.Logger.Warn("recheck subscriptions; refusing what can be, trying the rest again",
			"user_id", w.UserID(), "targets", len(targets), "err", err)
	}
	for i, k := range keys {
		a.settle(k, before[i], ds[i], err, again)
	}
}
