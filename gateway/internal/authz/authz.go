// Package authz decides who may watch whom on a gateway, and who may see
// whose last_seen, and registers what it allows in the gateway's hub. Who
// may watch whom comes from one of three sources, by policy: the follow
// graph (mutual, follow, everyone), the watch claim of the watcher's token
// (token), or the app, asked over HTTP or NATS (app). Privacy settings
// apply under every policy.
//
// It is the one place where these questions are answered: WebSocket
// subscriptions (Subscribe), the HTTP API (Decide, Friends), and global
// presence (Everyone, LastSeenTo, LastSeenOf) all ask it. A subscription
// is decided and registered as one step: a graph change that lands
// between the two makes the targets it touches be decided again before
// anything is registered, and a change that lands after the
// registration re-checks the subscriptions it touches (Changed). A
// re-check that cannot read the graph (NATS slow or away) is tried again
// until it decides or the subscription ends, and what it can refuse
// without that read it refuses at once. So an unfollow can never leave a
// socket watching someone it may no longer watch.
package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// Policy says who may watch whom.
type Policy string

// The policies.
const (
	// Mutual lets A watch B only when A follows B and B follows A.
	Mutual Policy = "mutual"
	// Follow lets A watch B when A follows B.
	Follow Policy = "follow"
	// Everyone lets anyone watch anyone, and allows global presence.
	Everyone Policy = "everyone"
	// Token lets A watch B when A's token lists B in its watch claim.
	Token Policy = "token"
	// App lets A watch B when the app, asked, says so.
	App Policy = "app"
)

// Valid reports whether p is one of the policies.
func (p Policy) Valid() bool {
	return p == Mutual || p == Follow || p == Everyone || p == Token || p == App
}

// external reports whether the policy takes who may watch whom from the
// app (its tokens or its answers) rather than from the follow graph.
func (p Policy) external() bool { return p == Token || p == App }

// Graph reads the follow graph and privacy settings (presence.Store).
type Graph interface {
	// Follows reports whether a follows b.
	Follows(ctx context.Context, a, b string) (bool, error)
	// FollowingAtMost returns everyone a follows, and true, when they are
	// at most max; else the first max, and false.
	FollowingAtMost(ctx context.Context, a string, max int) ([]string, bool, error)
	// Settings returns a user's privacy settings.
	Settings(ctx context.Context, userID string) (presence.Settings, error)
}

// Notifier tells a socket that one of its subscriptions changed after a
// graph change: it is the gateway's part, which writes to the socket.
type Notifier interface {
	// Revoked says w may no longer watch user: its subscription was ended
	// for reason (a denial reason of the protocol).
	Revoked(w hub.Watcher, user, reason string)
	// Reshow says what each of ws may see of user changed (its
	// last_seen): each is to be sent user's presence again. One call
	// carries every socket of one change, so that the presence is read
	// once for them all.
	Reshow(user string, ws []hub.Watcher)
}

// Config configures an Authorizer.
type Config struct {
	// Policy says who may watch whom.
	Policy Policy
	// Graph is read for follow edges and settings.
	Graph Graph
	// CacheTTL bounds how long what was read of the graph is cached;
	// Changed drops an entry sooner.
	CacheTTL time.Duration
	// Hub is where allowed subscriptions are registered.
	Hub *hub.Hub
	// SocketsOf returns the sockets of a user on this gateway.
	SocketsOf func(userID string) []hub.Watcher
	// Notify is told of subscriptions a graph change ended or changed.
	Notify Notifier
	// Logger receives what fails while re-checking.
	Logger *slog.Logger

	// App answers the questions of the app policy.
	App AppSource
	// AppCacheTTL bounds how long an answer of the app is cached, per
	// watcher and target; Invalidate drops an entry sooner.
	AppCacheTTL time.Duration
	// CacheLookup, when set, is told of every look-up of an answer of the
	// app in the cache: whether it was found (metrics).
	CacheLookup func(hit bool)
}

// Decision is what the authorizer says of one watcher and one target.
type Decision struct {
	// Allowed reports that the watcher may watch the target.
	Allowed bool
	// Reason is the denial reason when not allowed.
	Reason string
	// LastSeen reports that the watcher may see the target's last_seen.
	LastSeen bool
}

// refused reports that d refuses, with its reason. A refusal holds even
// when Decide or DecideAll fails: it was made from what could be read
// (follow edges, the watch list, the app's answer), and needs none of the
// reads that failed; what is not refused is unknown then.
func (d Decision) refused() bool { return !d.Allowed && d.Reason != "" }

// Denial is a target a subscribe was refused, and why.
type Denial struct {
	User, Reason string
}

// ErrGraphBusy means the graph kept changing under a subscription for as
// long as the authorizer tried to decide it; the client may try again.
var ErrGraphBusy = errors.New("the follow graph changed while the subscription was decided; try again")

// maxCacheEntries bounds each cache; a full cache is emptied.
const maxCacheEntries = 200_000

// readConcurrency bounds the graph reads of one request in flight at once.
const readConcurrency = 16

// maxAttempts bounds how often Subscribe decides again because the graph
// moved.
const maxAttempts = 16

// Authorizer decides and registers subscriptions. It is safe for
// concurrent use.
type Authorizer struct {
	cfg Config

	mu       sync.Mutex
	edges    map[string]cached[bool] // follow key -> it exists
	settings map[string]cached[presence.Settings]
	answers  map[pair]cached[bool] // the app's answers
	// gen counts the entries dropped by graph changes: a read that began
	// before one is not cached, since it may predate the change.
	gen uint64
	// tickets are the subscriptions being decided.
	tickets map[*ticket]struct{}
	// retries are the re-checks that failed, to be tried again, each
	// with its mark: the value of retrySeq when it was queued. retrying
	// says a goroutine tries them (retry.go).
	retries  map[retryKey]uint64
	retrySeq uint64
	retrying bool
	// closed is set by Close: no retry loop starts after it.
	closed bool

	// ctx ends with Close, and with it the retry loop, which loops
	// tracks.
	ctx    context.Context
	cancel context.CancelFunc
	loops  sync.WaitGroup

	// decided, when set, is called by Subscribe between deciding and
	// registering (tests make the graph change there).
	decided atomic.Pointer[func()]
}

// cached is what a read of the graph or a question to the app found, and
// when.
type cached[V any] struct {
	v  V
	at time.Time
}

// readThrough returns m's entry for key if it is younger than the cache's
// TTL, or else what read returns, cached unless the graph changed while
// it read (the read may predate the change); a cache of maxCacheEntries
// is emptied first.
func readThrough[V any](a *Authorizer, m map[string]cached[V], key string, read func() (V, error)) (V, error) {
	now := time.Now()
	a.mu.Lock()
	e, ok := m[key]
	gen := a.gen
	a.mu.Unlock()
	if ok && now.Sub(e.at) < a.cfg.CacheTTL {
		return e.v, nil
	}
	v, err := read()
	if err != nil {
		return v, err
	}
	a.mu.Lock()
	if a.gen == gen {
		if len(m) >= maxCacheEntries {
			clear(m)
		}
		m[key] = cached[V]{v, now}
	}
	a.mu.Unlock()
	return v, nil
}

// ticket is a subscription being decided: the graph changes that touch it
// mark its targets to be decided again.
type ticket struct {
	watcher string
	targets map[string]bool // target -> touched since it was decided
	touched bool
}

// New returns an authorizer. It starts nothing and does no I/O; a
// re-check that fails later starts the goroutine that tries it again,
// which ends once no re-check is left to try, or at Close.
func New(cfg Config) *Authorizer {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Authorizer{
		cfg:      cfg,
		edges:    make(map[string]cached[bool]),
		settings: make(map[string]cached[presence.Settings]),
		answers:  make(map[pair]cached[bool]),
		tickets:  make(map[*ticket]struct{}),
		retries:  make(map[retryKey]uint64),
		ctx:      ctx,
		cancel:   cancel,
	}
}

// Close stops the re-checks that wait to be tried again, and returns once
// the goroutine trying them has returned; none is tried after it. The
// authorizer decides as before, but re-checks that fail are dropped.
func (a *Authorizer) Close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.cancel()
	a.loops.Wait()
}

// Everyone reports whether the policy lets anyone watch anyone, and so
// allows global presence.
func (a *Authorizer) Everyone() bool { return a.cfg.Policy == Everyone }

// Decide says whether watcher may watch target, and see its last_seen.
// When it fails, a refusal it returns still holds (see Decision.refused).
func (a *Authorizer) Decide(ctx context.Context, watcher, target string) (Decision, error) {
	if watcher == target {
		return Decision{Allowed: true, LastSeen: true}, nil
	}
	if a.cfg.Policy.external() {
		ds, err := a.decideExternal(ctx, watcher, []string{target})
		return ds[0], err
	}
	// The target follows the watcher: the watcher is one of the target's
	// contacts, for last_seen and for the mutual policy.
	back, err := a.follows(ctx, target, watcher)
	if err != nil {
		return Decision{}, err
	}
	var d Decision
	switch a.cfg.Policy {
	case Everyone:
		d.Allowed = true
	case Follow:
		fwd, err := a.follows(ctx, watcher, target)
		if err != nil {
			return Decision{}, err
		}
		d.Allowed, d.Reason = fwd, protocol.ReasonNotFollowing
	default:
		fwd := false
		if back {
			if fwd, err = a.follows(ctx, watcher, target); err != nil {
				return Decision{}, err
			}
		}
		d.Allowed, d.Reason = fwd && back, protocol.ReasonNotMutualFollowers
	}
	if !d.Allowed {
		return d, nil
	}
	d.Reason = ""
	d.LastSeen, err = a.lastSeen(ctx, target, back)
	return d, err
}

// DecideAll decides every target for watcher, reading the graph in
// parallel. Under the app policy the targets not cached are asked in one
// question. When it fails, the refusals it returns still hold (see
// Decision.refused).
func (a *Authorizer) DecideAll(ctx context.Context, watcher string, targets []string) ([]Decision, error) {
	if a.cfg.Policy.external() {
		return a.decideExternal(ctx, watcher, targets)
	}
	out := make([]Decision, len(targets))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, t := range targets {
		g.Go(func() error {
			d, err := a.Decide(gctx, watcher, t)
			out[i] = d
			return err
		})
	}
	return out, g.Wait()
}

// Subscribe decides whether w may watch each of targets (valid user ids,
// each once) and registers the allowed ones in the hub, blocked until
// their snapshot is settled (hub.Settle). It returns what it registered,
// what it refused, and whether the hub made a new NATS subscription (see
// hub.Add). A graph change that touches a target while it is decided has
// it decided again before anything is registered.
func (a *Authorizer) Subscribe(ctx context.Context, w hub.Watcher, targets []string) ([]hub.Grant, []Denial, bool, error) {
	t := &ticket{watcher: w.UserID(), targets: make(map[string]bool, len(targets))}
	for _, u := range targets {
		t.targets[u] = false
	}
	a.mu.Lock()
	a.tickets[t] = struct{}{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.tickets, t)
		a.mu.Unlock()
	}()

	decided := make(map[string]Decision, len(targets))
	todo := targets
	for range maxAttempts {
		// The watch list is read again each time: a token refresh
		// touches the subscriptions being decided.
		ds, err := a.DecideAll(withListOf(ctx, w), t.watcher, todo)
		if err != nil {
			return nil, nil, false, err
		}
		for i, u := range todo {
			decided[u] = ds[i]
		}
		if fn := a.decided.Load(); fn != nil {
			(*fn)()
		}
		a.mu.Lock()
		if !t.touched {
			grants, denied := split(targets, decided)
			subscribed, err := a.cfg.Hub.Add(w, grants)
			a.mu.Unlock()
			return grants, denied, subscribed, err
		}
		todo = todo[:0:0]
		for u, touched := range t.targets {
			if touched {
				todo = append(todo, u)
				t.targets[u] = false
			}
		}
		t.touched = false
		a.mu.Unlock()
	}
	return nil, nil, false, ErrGraphBusy
}

// ForTest returns the authorizer's test hooks.
func (a *Authorizer) ForTest() Hooks { return Hooks{a} }

// Hooks reach into an Authorizer for tests.
type Hooks struct{ a *Authorizer }

// AfterDecide has Subscribe call fn each time it has decided and is about
// to register (or decide again).
func (h Hooks) AfterDecide(fn func()) { h.a.decided.Store(&fn) }

// split sorts targets into grants and denials, in their order.
func split(targets []string, decided map[string]Decision) ([]hub.Grant, []Denial) {
	var grants []hub.Grant
	var denied []Denial
	for _, u := range targets {
		d := decided[u]
		if d.Allowed {
			grants = append(grants, hub.Grant{User: u, LastSeen: d.LastSeen})
		} else {
			denied = append(denied, Denial{User: u, Reason: d.Reason})
		}
	}
	return grants, denied
}

// Friends returns user's mutual followers (of the first max users user
// follows), with whether user may see each one's last_seen.
//
// Under the token policy they are the users of the watch list; under the
// app policy, those the app lists when asked.
func (a *Authorizer) Friends(ctx context.Context, user string, max int) ([]hub.Grant, error) {
	if a.cfg.Policy.external() {
		return a.friendsExternal(ctx, user, max)
	}
	following, _, err := a.cfg.Graph.FollowingAtMost(ctx, user, max)
	if err != nil {
		return nil, err
	}
	found := make([]*hub.Grant, len(following))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, u := range following {
		if u == user {
			continue
		}
		g.Go(func() error {
			back, err := a.follows(gctx, u, user)
			if err != nil || !back {
				return err
			}
			show, err := a.lastSeen(gctx, u, true)
			if err != nil {
				return err
			}
			found[i] = &hub.Grant{User: u, LastSeen: show}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var out []hub.Grant
	for _, f := range found {
		if f != nil {
			out = append(out, *f)
		}
	}
	return out, nil
}

// follows reports whether x follows y.
func (a *Authorizer) follows(ctx context.Context, x, y string) (bool, error) {
	return readThrough(a, a.edges, presence.FollowKey(x, y), func() (bool, error) {
		return a.cfg.Graph.Follows(ctx, x, y)
	})
}

// settingsOf returns a user's privacy settings.
func (a *Authorizer) settingsOf(ctx context.Context, userID string) (presence.Settings, error) {
	return readThrough(a, a.settings, userID, func() (presence.Settings, error) {
		return a.cfg.Graph.Settings(ctx, userID)
	})
}

// Changed applies one change of the graph bucket, by its key: it drops
// what was cached, has the subscriptions being decided that it touches
// decided again, and re-checks the registered subscriptions it touches.
// The gateway calls it for every change its watcher of the graph sees, in
// order, from one goroutine.
func (a *Authorizer) Changed(ctx context.Context, key string) {
	if x, y, ok := presence.ParseFollowKey(key); ok && !a.cfg.Policy.external() {
		a.mu.Lock()
		delete(a.edges, key)
		a.gen++
		// x -> y decides whether x may watch y (every policy but
		// everyone), whether y may watch x (mutual), and whether y may
		// see x's last_seen (contacts).
		a.touchLocked(func(t *ticket, target string) bool {
			return t.watcher == x && target == y || t.watcher == y && target == x
		})
		a.mu.Unlock()
		var again showing
		a.recheckUser(ctx, x, y, &again)
		a.recheckUser(ctx, y, x, &again)
		a.show(&again)
		return
	}
	if u, ok := presence.ParseSettingsKey(key); ok {
		a.mu.Lock()
		delete(a.settings, u)
		a.gen++
		a.touchLocked(func(_ *ticket, target string) bool { return target == u })
		a.mu.Unlock()
		a.recheckWatchers(ctx, u)
	}
}

// recheckWatchers re-decides every subscription to u, after a change of
// u's settings, readConcurrency at once: under the contacts setting each
// watcher's decision reads an edge of its own. The settings are read
// first, once for them all (a failure is each re-check's to handle). The
// sockets that now see u's last_seen otherwise are shown u again, with
// one read of u's presence.
func (a *Authorizer) recheckWatchers(ctx context.Context, u string) {
	ws := a.cfg.Hub.WatchersOf(u)
	if len(ws) == 0 {
		return
	}
	_, _ = a.settingsOf(ctx, u)
	var again showing
	var g errgroup.Group
	g.SetLimit(readConcurrency)
	for _, w := range ws {
		g.Go(func() error {
			a.recheck(ctx, w, u, &again)
			return nil
		})
	}
	_ = g.Wait()
	a.show(&again)
}

// showing gathers the sockets that re-checks found are to be shown a user
// again, by user, so that each user's presence is read once for them.
type showing struct {
	mu sync.Mutex
	to map[string][]hub.Watcher
}

// add has k's target shown to k's socket again.
func (s *showing) add(k retryKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.to == nil {
		s.to = make(map[string][]hub.Watcher)
	}
	s.to[k.target] = append(s.to[k.target], k.w)
}

// show tells the sockets s gathered.
func (a *Authorizer) show(s *showing) {
	for user, ws := range s.to {
		a.cfg.Notify.Reshow(user, ws)
	}
}

// touchLocked marks the targets of tickets that match as to be decided
// again; the caller holds mu.
func (a *Authorizer) touchLocked(match func(t *ticket, target string) bool) {
	for t := range a.tickets {
		for target := range t.targets {
			if match(t, target) {
				t.targets[target] = true
				t.touched = true
			}
		}
	}
}

// recheckUser re-decides the subscriptions of watcher's sockets to target,
// gathering in again those to be shown target again.
func (a *Authorizer) recheckUser(ctx context.Context, watcher, target string, again *showing) {
	for _, w := range a.cfg.SocketsOf(watcher) {
		if a.cfg.Hub.Watching(w, target) {
			a.recheck(ctx, w, target, again)
		}
	}
}

// recheck re-decides w's subscription to target: one no longer allowed
// ends; one whose socket may now see otherwise is gathered in again, to
// have target shown to it again. One that cannot be decided for a failed
// read is tried again later.
func (a *Authorizer) recheck(ctx context.Context, w hub.Watcher, target string, again *showing) {
	k := retryKey{w, target}
	before := a.queued(k)
	d, err := a.Decide(withListOf(ctx, w), w.UserID(), target)
	if err != nil {
		a.cfg.Logger.Warn("recheck subscription; trying again", "user_id", w.UserID(), "target", target, "err", err)
	}
	a.settle(k, before, d, err, again)
}

// changeLocked makes k's subscription in the hub what d says, and returns
// how to tell its socket: one no longer allowed ends (told once, however
// many re-checks refuse it); a change of what it may see has its target
// shown again (gathered in again). The caller holds mu, so that re-checks
// change a subscription one at a time, and tells the socket once it has
// unlocked.
func (a *Authorizer) changeLocked(k retryKey, d Decision, again *showing) (tell func()) {
	h := a.cfg.Hub
	switch {
	case !d.Allowed && h.Watching(k.w, k.target):
		h.Remove(k.w, []string{k.target})
		return func() { a.cfg.Notify.Revoked(k.w, k.target, d.Reason) }
	case d.Allowed && h.SetLastSeen(k.w, k.target, d.LastSeen):
		return func() { again.add(k) }
	}
	return func() {}
}

// String returns the policy's name.
func (p Policy) String() string { return string(p) }

// ParsePolicy parses a policy name.
func ParsePolicy(s string) (Policy, error) {
	if p := Policy(s); p.Valid() {
		return p, nil
	}
	return "", fmt.Errorf("policy %q (want mutual, follow, everyone, token or app)", s)
}
