// Package hub keeps a gateway's subscriptions: which sockets watch which
// users, with what each socket may see of them, and the newest status
// revision each socket has of each user, so that a change reaches every
// watching socket once, in order, and never older than what the socket
// already has.
//
// The hub holds one NATS subscription per user watched by at least one
// socket (through the subscribe function it is given), so NATS carries a
// change only to the gateways that need it, once however many sockets
// watch it. It knows nothing of who may watch whom: the authorizer decides,
// and registers what it allows here.
package hub

import (
	"errors"
	"sync"

	"github.com/greendot/greendot/pkg/presence"
)

// Watcher is a socket that watches users. Implementations must be
// comparable (pointers).
type Watcher interface {
	// UserID returns the user the socket belongs to.
	UserID() string
	// Deliver queues a change of a watched user for the socket; at is when
	// the change was written (unix ms; zero if unknown). It must not block.
	Deliver(p presence.Presence, at int64)
	// Closed reports whether the socket closed. Once it reports true it
	// always does, and RemoveWatcher follows.
	Closed() bool
}

// Subscription is interest in one user's events, as the subscribe
// function of New returns it.
type Subscription interface {
	Unsubscribe() error
}

// Grant is a subscription the authorizer allowed.
type Grant struct {
	// User is the watched user.
	User string
	// LastSeen reports that the socket may see the user's last_seen.
	LastSeen bool
}

// Entry is a user's presence as of a status revision: what a snapshot
// read, for Settle.
type Entry struct {
	Presence presence.Presence
	Rev      uint64
}

// ErrClosed means the watcher was removed (its socket closed) while a
// subscription was being made.
var ErrClosed = errors.New("hub: watcher closed")

// Hub is safe for concurrent use, with one rule: Deliver is called from
// one goroutine at a time (the gateway's event dispatcher), which keeps
// events in order.
type Hub struct {
	subscribe func(user string) (Subscription, error)

	mu        sync.RWMutex
	targets   map[string]*target            // watched user -> its watchers
	byWatcher map[Watcher]map[string]*watch // watcher -> what it watches
}

// target is a watched user.
type target struct {
	sub      Subscription // nil when events come from a shared subscription
	watchers map[Watcher]*watch
	// last is the newest state of the user the hub knows: from an event,
	// a snapshot settled, or a state resent; zero Rev if none. No watch
	// has a newer revision.
	last presence.Event
}

// know takes p, the user's state at status revision rev written at (unix
// ms, 0 if unknown), as the newest known if it is newer.
func (t *target) know(p presence.Presence, rev uint64, at int64) {
	if rev > t.last.Rev {
		t.last = presence.Event{UserID: p.UserID, Status: p.Status, LastSeen: p.LastSeen, Platforms: p.Platforms, Custom: p.Custom, Rev: rev, At: at}
	}
}

// watch is one socket's subscription to one user.
type watch struct {
	// rev is the status revision of the newest state the socket has of the
	// user; events not newer are dropped. It is written only by Deliver
	// (under the read lock: Deliver runs on one goroutine) or under the
	// write lock.
	rev uint64
	// lastSeen reports that the socket may see the user's last_seen.
	lastSeen bool
	// blocked reports that the socket's snapshot of the user is being read
	// (from Add to Settle or Cancel): events wait for the snapshot, and rev
	// stays what the socket had, for Cancel to go back to.
	blocked bool
	// added reports that the Add being settled made the watch: Cancel ends
	// it rather than unblocking it.
	added bool
}

// New returns a hub that calls subscribe to receive the events of a user
// that a socket starts watching, and ends that subscription when no socket
// watches the user any more. A nil subscribe means the events of every user
// arrive anyway (the gateway subscribed to all of them).
func New(subscribe func(user string) (Subscription, error)) *Hub {
	return &Hub{
		subscribe: subscribe,
		targets:   make(map[string]*target),
		byWatcher: make(map[Watcher]map[string]*watch),
	}
}

// Add registers (or resets) w's subscriptions to the granted users,
// blocked until Settle gives their snapshots (or Cancel gives up on them),
// and subscribes to the events of users nobody watched yet. It reports
// whether it made a subscription: the caller then makes sure NATS knows of
// it (a flush) before reading snapshots, so that no event published after
// the read is missed. It fails with ErrClosed when w is closed: a socket
// that closes while its subscribe is being decided leaves nothing behind.
// When a subscription cannot be made it fails having changed nothing.
func (h *Hub) Add(w Watcher, grants []Grant) (subscribed bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.Closed() {
		return false, ErrClosed
	}
	if subscribed, err = h.targetLocked(grants); err != nil {
		return false, err
	}
	for _, g := range grants {
		h.watchLocked(w, g)
	}
	return subscribed, nil
}

// targetLocked makes every granted user a target, subscribing to the
// events of the new ones, and reports whether it subscribed. All of them
// are made before any watch is touched, so that a subscription that fails
// leaves no watch blocked with nothing to settle it: the targets made
// before it are dropped again.
func (h *Hub) targetLocked(grants []Grant) (subscribed bool, err error) {
	for i, g := range grants {
		if h.targets[g.User] != nil {
			continue
		}
		t := &target{watchers: make(map[Watcher]*watch)}
		if h.subscribe != nil {
			if t.sub, err = h.subscribe(g.User); err != nil {
				for _, g := range grants[:i] {
					// Only a target made here has no watcher yet.
					if made := h.targets[g.User]; made != nil && len(made.watchers) == 0 {
						h.endLocked(g.User, made)
					}
				}
				return false, err
			}
			subscribed = true
		}
		h.targets[g.User] = t
	}
	return subscribed, nil
}

// watchLocked registers w's watch of g's user, whose target exists,
// blocked; a watch w had already keeps its rev, for Cancel.
func (h *Hub) watchLocked(w Watcher, g Grant) {
	t := h.targets[g.User]
	wt := t.watchers[w]
	if wt == nil {
		wt = &watch{added: true}
		t.watchers[w] = wt
		subs := h.byWatcher[w]
		if subs == nil {
			subs = make(map[string]*watch)
			h.byWatcher[w] = subs
		}
		subs[g.User] = wt
	}
	wt.blocked, wt.lastSeen = true, g.LastSeen
}

// Settle unblocks w's subscriptions to the users of snapshot. An event
// newer than a snapshot entry that arrived meanwhile replaces it, so the
// snapshot ends up holding the newest state of each user, as w may see it
// (last_seen removed where it may not). Entries of subscriptions that are
// gone (revoked meanwhile) are removed from the result.
func (h *Hub) Settle(w Watcher, snapshot []Entry) []Entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := snapshot[:0]
	subs := h.byWatcher[w]
	for _, e := range snapshot {
		wt := subs[e.Presence.UserID]
		if wt == nil {
			continue
		}
		t := h.targets[e.Presence.UserID]
		if t.know(e.Presence, e.Rev, 0); t.last.Rev > e.Rev {
			e.Rev, e.Presence = t.last.Rev, t.last.Presence()
		}
		wt.rev, wt.blocked, wt.added = e.Rev, false, false
		if !wt.lastSeen {
			e.Presence.LastSeen = 0
		}
		out = append(out, e)
	}
	return out
}

// Cancel undoes what Add did to w's subscriptions to users, whose
// snapshots could not be read, so that the failed subscribe changes
// nothing: the watches it made end, and those w had before are unblocked
// at the revision w has, with the newest change that came meanwhile
// delivered (events wait while blocked). What w may see of last_seen
// stays as the authorizer last decided: the old value may be one a
// privacy change has since taken back. Watches that are not blocked (Add
// never reached them, or they were revoked meanwhile) are left alone.
func (h *Hub) Cancel(w Watcher, users []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	subs := h.byWatcher[w]
	for _, u := range users {
		wt := subs[u]
		switch {
		case wt == nil || !wt.blocked:
		case wt.added:
			h.dropLocked(w, u)
			delete(subs, u)
		default:
			wt.blocked = false
			h.catchUpLocked(w, h.targets[u], wt)
		}
	}
	if len(subs) == 0 {
		delete(h.byWatcher, w)
	}
}

// catchUpLocked delivers to w the newest event of t if w's watch wt does
// not have it yet. The caller holds the write lock.
func (h *Hub) catchUpLocked(w Watcher, t *target, wt *watch) {
	if t.last.Rev <= wt.rev {
		return
	}
	wt.rev = t.last.Rev
	p := t.last.Presence()
	if !wt.lastSeen {
		p.LastSeen = 0
	}
	w.Deliver(p, t.last.At)
}

// Remove ends w's subscriptions to users.
func (h *Hub) Remove(w Watcher, users []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	subs := h.byWatcher[w]
	for _, u := range users {
		if _, ok := subs[u]; ok {
			h.dropLocked(w, u)
			delete(subs, u)
		}
	}
	if len(subs) == 0 {
		delete(h.byWatcher, w)
	}
}

// RemoveWatcher ends every subscription of w, whose socket closed (its
// Closed reports true already).
func (h *Hub) RemoveWatcher(w Watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for u := range h.byWatcher[w] {
		h.dropLocked(w, u)
	}
	delete(h.byWatcher, w)
}

// dropLocked removes w from the watchers of user and ends the user's
// subscription when w was the last; the caller updates byWatcher.
func (h *Hub) dropLocked(w Watcher, user string) {
	t := h.targets[user]
	if t == nil {
		return
	}
	delete(t.watchers, w)
	if len(t.watchers) == 0 {
		h.endLocked(user, t)
	}
}

// endLocked ends the subscription of user's target t, which nobody
// watches any more.
func (h *Hub) endLocked(user string, t *target) {
	if t.sub != nil {
		_ = t.sub.Unsubscribe()
	}
	delete(h.targets, user)
}

// Count returns how many users w watches.
func (h *Hub) Count(w Watcher) int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.byWatcher[w])
}

// Watching reports whether w watches user.
func (h *Hub) Watching(w Watcher, user string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	_, ok := h.byWatcher[w][user]
	return ok
}

// SetLastSeen changes whether w may see user's last_seen, and reports
// whether it changed.
func (h *Hub) SetLastSeen(w Watcher, user string, show bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	wt := h.byWatcher[w][user]
	if wt == nil || wt.lastSeen == show {
		return false
	}
	wt.lastSeen = show
	return true
}

// WatchersOf returns the watchers of user.
func (h *Hub) WatchersOf(user string) []Watcher {
	h.mu.RLock()
	defer h.mu.RUnlock()
	t := h.targets[user]
	if t == nil {
		return nil
	}
	out := make([]Watcher, 0, len(t.watchers))
	for w := range t.watchers {
		out = append(out, w)
	}
	return out
}

// WatchedBy returns the users w watches.
func (h *Hub) WatchedBy(w Watcher) []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]string, 0, len(h.byWatcher[w]))
	for u := range h.byWatcher[w] {
		out = append(out, u)
	}
	return out
}

// Watchers returns every watcher that watches someone.
func (h *Hub) Watchers() []Watcher {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]Watcher, 0, len(h.byWatcher))
	for w := range h.byWatcher {
		out = append(out, w)
	}
	return out
}

// Users returns every watched user.
func (h *Hub) Users() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]string, 0, len(h.targets))
	for u := range h.targets {
		out = append(out, u)
	}
	return out
}

// Len returns how many users are watched.
func (h *Hub) Len() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.targets)
}

// Deliver hands an event to every watcher of its user that does not have
// its revision yet, and returns how many it dropped as not newer. Call it
// from one goroutine at a time.
func (h *Hub) Deliver(ev *presence.Event) (dropped int) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	t := h.targets[ev.UserID]
	if t == nil {
		return 0
	}
	t.know(ev.Presence(), ev.Rev, ev.At)
	p := ev.Presence()
	for w, wt := range t.watchers {
		if wt.blocked || wt.rev >= ev.Rev {
			dropped++
			continue
		}
		wt.rev = ev.Rev
		q := p
		if !wt.lastSeen {
			q.LastSeen = 0
		}
		w.Deliver(q, ev.At)
	}
	return dropped
}

// Resend hands the user's newest state the hub knows, p read at status
// revision rev or a newer one, to w's subscription to p's user even if w
// already has that revision: what w may see of it changed (last_seen
// visibility). It does nothing while w's snapshot of the user is being
// read.
func (h *Hub) Resend(w Watcher, p presence.Presence, rev uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.targets[p.UserID]
	if t == nil {
		return
	}
	wt := t.watchers[w]
	if wt == nil || wt.blocked {
		return
	}
	if t.know(p, rev, 0); t.last.Rev > rev {
		p, rev = t.last.Presence(), t.last.Rev
	}
	wt.rev = rev
	if !wt.lastSeen {
		p.LastSeen = 0
	}
	w.Deliver(p, 0)
}

// Close ends every subscription.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for u, t := range h.targets {
		if t.sub != nil {
			_ = t.sub.Unsubscribe()
		}
		delete(h.targets, u)
	}
	clear(h.byWatcher)
}
