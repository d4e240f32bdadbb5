package gateway

import (
	"context"
	"encoding/json"
	"math"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/pkg/presence"
)

// hub knows which sockets watch which users, and which sockets belong to
// which user. It holds one NATS subscription on presence.event.<user> per
// user watched by at least one socket of this gateway, so NATS carries a
// change only to the gateways that need it, once however many sockets
// watch it. Subscriptions deliver into one channel, read by one goroutine:
// there is no goroutine per subscription.
//
// A hub is safe for concurrent use.
type hub struct {
	s *Service

	mu      sync.RWMutex
	targets map[string]*target // watched user -> watchers

	umu   sync.RWMutex
	users map[string][]*conn // user -> their connections on this gateway

	events chan *nats.Msg
	// calls runs functions on the dispatcher goroutine, in order with the
	// events.
	calls chan func()
}

// target is a watched user.
type target struct {
	sub      *nats.Subscription
	watchers map[*conn]*watch
	// last is the newest event seen for the user; zero Rev if none.
	last presence.Event
}

// watch is one socket's subscription to one user.
type watch struct {
	// rev is the status revision of the newest state the socket has of the
	// user; events not newer are dropped. It is math.MaxUint64 while the
	// socket's snapshot is being read. Written only by the dispatcher (under
	// the read lock) or under the write lock.
	rev uint64
	// lastSeen reports that the socket may see the user's last_seen.
	lastSeen bool
}

// blocked is a watch's rev while its snapshot is being read.
const blocked = math.MaxUint64

func newHub(s *Service) *hub {
	return &hub{
		s:       s,
		targets: make(map[string]*target),
		users:   make(map[string][]*conn),
		events:  make(chan *nats.Msg, 64*1024),
		calls:   make(chan func(), 1024),
	}
}

// targetCount returns how many users are watched.
func (h *hub) targetCount() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.targets)
}

// addUserConn indexes c under its user. It fails when the user already has
// MaxConnsPerUser connections here.
func (h *hub) addUserConn(c *conn) error {
	h.umu.Lock()
	defer h.umu.Unlock()
	cs := h.users[c.userID]
	if len(cs) >= h.s.cfg.MaxConnsPerUser {
		return ErrTooManyConns
	}
	h.users[c.userID] = append(cs, c)
	return nil
}

// userConns returns the connections of a user on this gateway.
func (h *hub) userConns(userID string) []*conn {
	h.umu.RLock()
	defer h.umu.RUnlock()
	return append([]*conn(nil), h.users[userID]...)
}

// findConn returns a connection of a user by id.
func (h *hub) findConn(userID, connID string) *conn {
	h.umu.RLock()
	defer h.umu.RUnlock()
	for _, c := range h.users[userID] {
		if c.connID == connID {
			return c
		}
	}
	return nil
}

// removeConn forgets every subscription of c and unindexes it.
func (h *hub) removeConn(c *conn) {
	h.mu.Lock()
	for userID := range c.subs {
		h.dropLocked(c, userID)
	}
	c.subs = nil
	h.mu.Unlock()

	h.umu.Lock()
	cs := h.users[c.userID]
	for i, x := range cs {
		if x == c {
			cs[i] = cs[len(cs)-1]
			cs[len(cs)-1] = nil
			cs = cs[:len(cs)-1]
			break
		}
	}
	if len(cs) == 0 {
		delete(h.users, c.userID)
	} else {
		h.users[c.userID] = cs
	}
	h.umu.Unlock()
}

// subCount returns how many users c watches.
func (h *hub) subCount(c *conn) int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(c.subs)
}

// watching reports whether c watches userID.
func (h *hub) watching(c *conn, userID string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	_, ok := c.subs[userID]
	return ok
}

// begin adds (or resets) c's subscriptions to users, blocked until finish
// is called with their snapshots, and subscribes to the events of users
// nobody here watched yet. It reports whether a NATS subscription was made,
// in which case the caller flushes the NATS connection before reading
// snapshots, so that no event published after the read is missed.
func (h *hub) begin(c *conn, users []string, lastSeen []bool) (subscribed bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c.closed.Load() {
		return false, errConnClosed
	}
	for i, u := range users {
		t := h.targets[u]
		if t == nil {
			sub, err := h.s.nc.ChanSubscribe(presence.EventSubject(u), h.events)
			if err != nil {
				return subscribed, err
			}
			// Event subjects carry little: a pending limit in messages
			// keeps a burst from being dropped by byte count.
			_ = sub.SetPendingLimits(-1, -1)
			t = &target{sub: sub, watchers: make(map[*conn]*watch)}
			h.targets[u] = t
			subscribed = true
		}
		w := t.watchers[c]
		if w == nil {
			w = &watch{}
			t.watchers[c] = w
			if c.subs == nil {
				c.subs = make(map[string]*watch)
			}
			c.subs[u] = w
		}
		w.rev, w.lastSeen = blocked, lastSeen[i]
	}
	return subscribed, nil
}

// finish unblocks c's subscriptions to snapshot's users. An event newer
// than a snapshot entry that arrived meanwhile replaces it, so snapshot
// ends up holding the newest state of each user.
func (h *hub) finish(c *conn, snapshot []snapshotEntry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range snapshot {
		e := &snapshot[i]
		t := h.targets[e.p.UserID]
		if t == nil {
			continue
		}
		w := t.watchers[c]
		if w == nil {
			continue
		}
		if t.last.Rev > e.rev {
			e.rev = t.last.Rev
			e.p = t.last.Presence()
		}
		w.rev = e.rev
		if !w.lastSeen {
			e.p.LastSeen = 0
		}
	}
}

// unsubscribe removes c's subscriptions to users.
func (h *hub) unsubscribe(c *conn, users []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, u := range users {
		if _, ok := c.subs[u]; ok {
			h.dropLocked(c, u)
			delete(c.subs, u)
		}
	}
}

// dropLocked removes c from the watchers of userID and ends the NATS
// subscription when it was the last one. The caller removes the entry from
// c.subs.
func (h *hub) dropLocked(c *conn, userID string) {
	t := h.targets[userID]
	if t == nil {
		return
	}
	delete(t.watchers, c)
	if len(t.watchers) == 0 {
		_ = t.sub.Unsubscribe()
		delete(h.targets, userID)
	}
}

// setLastSeen changes whether c may see userID's last_seen, and reports
// whether it changed.
func (h *hub) setLastSeen(c *conn, userID string, show bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := c.subs[userID]
	if w == nil || w.lastSeen == show {
		return false
	}
	w.lastSeen = show
	return true
}

// watchersOf returns the sockets watching userID.
func (h *hub) watchersOf(userID string) []*conn {
	h.mu.RLock()
	defer h.mu.RUnlock()
	t := h.targets[userID]
	if t == nil {
		return nil
	}
	out := make([]*conn, 0, len(t.watchers))
	for c := range t.watchers {
		out = append(out, c)
	}
	return out
}

// watchedUsers returns every watched user.
func (h *hub) watchedUsers() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]string, 0, len(h.targets))
	for u := range h.targets {
		out = append(out, u)
	}
	return out
}

// dispatch reads events until the events channel is closed, and runs
// calls. It is the only goroutine that delivers events, so their order is
// kept.
func (h *hub) dispatch(selfSubject string) {
	for {
		var msg *nats.Msg
		select {
		case fn := <-h.calls:
			fn()
			continue
		case m, ok := <-h.events:
			if !ok {
				return
			}
			msg = m
		}
		h.s.metrics.eventsIn.Inc()
		if msg.Subject == selfSubject {
			var ev presence.SelfEvent
			if err := json.Unmarshal(msg.Data, &ev); err != nil {
				h.s.log.Warn("undecodable self event", "subject", msg.Subject, "err", err)
				continue
			}
			h.deliverSelf(&ev)
			continue
		}
		var ev presence.Event
		if err := json.Unmarshal(msg.Data, &ev); err != nil || !presence.ValidUserID(ev.UserID) {
			h.s.log.Warn("undecodable presence event", "subject", msg.Subject, "err", err)
			continue
		}
		h.deliver(&ev)
	}
}

// call runs fn on the dispatcher goroutine, unless ctx ends first.
func (h *hub) call(ctx context.Context, fn func()) {
	select {
	case h.calls <- fn:
	case <-ctx.Done():
	}
}

// inject delivers a presence event that did not come from NATS (a resync).
func (h *hub) inject(ctx context.Context, ev *presence.Event) {
	h.call(ctx, func() { h.deliver(ev) })
}

// resend delivers p, read at status revision rev, to c's subscription to
// p's user even if c already has that revision: c's view of it changed
// (last_seen visibility). A newer event seen meanwhile wins.
func (h *hub) resend(ctx context.Context, c *conn, p presence.Presence, rev uint64) {
	h.call(ctx, func() {
		h.mu.RLock()
		defer h.mu.RUnlock()
		t := h.targets[p.UserID]
		if t == nil {
			return
		}
		w := t.watchers[c]
		if w == nil || w.rev == blocked {
			return
		}
		if t.last.Rev > rev {
			p, rev = t.last.Presence(), t.last.Rev
		}
		w.rev = max(w.rev, rev)
		if !w.lastSeen {
			p.LastSeen = 0
		}
		c.enqueue(p, 0)
	})
}

// closeAll ends every NATS subscription of the hub.
func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for u, t := range h.targets {
		_ = t.sub.Unsubscribe()
		delete(h.targets, u)
	}
}

// deliver queues a presence event for every socket watching its user that
// does not have it yet.
func (h *hub) deliver(ev *presence.Event) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	t := h.targets[ev.UserID]
	if t == nil {
		return
	}
	if ev.Rev > t.last.Rev {
		t.last = *ev
	}
	p := ev.Presence()
	dropped := 0
	for c, w := range t.watchers {
		if w.rev >= ev.Rev { // also while blocked
			dropped++
			continue
		}
		w.rev = ev.Rev
		q := p
		if !w.lastSeen {
			q.LastSeen = 0
		}
		c.enqueue(q, ev.At)
	}
	if dropped > 0 {
		h.s.metrics.eventsDropped.Add(float64(dropped))
	}
}

// deliverSelf queues a self event for every connection of its user.
func (h *hub) deliverSelf(ev *presence.SelfEvent) {
	for _, c := range h.userConns(ev.UserID) {
		c.enqueueSelf(ev.Rev, ev.Status, ev.Devices)
	}
}

// enqueue adds a change to c's next batch, replacing an older change of the
// same user. at is when the change was written (unix ms), for the
// propagation histogram.
func (c *conn) enqueue(p presence.Presence, at int64) {
	c.pmu.Lock()
	replaced := false
	for i := range c.pending {
		if c.pending[i].UserID == p.UserID {
			c.pending[i] = p
			replaced = true
			break
		}
	}
	if !replaced {
		c.pending = append(c.pending, p)
	}
	if at != 0 && (c.oldest == 0 || at < c.oldest) {
		c.oldest = at
	}
	queue := !c.queued
	c.queued = true
	c.pmu.Unlock()
	if queue {
		c.s.flusher.add(c)
	}
}

// enqueueSelf records the user's own newest status for c's next batch.
func (c *conn) enqueueSelf(rev uint64, status presence.Status, devices int) {
	c.pmu.Lock()
	if rev <= c.self.rev {
		c.pmu.Unlock()
		return
	}
	c.self = selfState{rev: rev, status: status, devices: devices, pending: true}
	queue := !c.queued
	c.queued = true
	c.pmu.Unlock()
	if queue {
		c.s.flusher.add(c)
	}
}
