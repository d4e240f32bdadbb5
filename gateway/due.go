package gateway

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/gobwas/ws"
)

// dueRing has each connection looked at when the first of its deadlines
// may have come (no frame for the TTL, its token's expiry, no sign of use
// for the away-after period), and not in between: a gateway holding 100,000
// idle connections looks at a few thousand a second, where a sweep of
// every connection every step looked at 200,000.
//
// It is a ring of slots, one per step of time (a tick), each holding the
// connections to look at on that tick; a connection is due on one tick at
// a time (conn.due). Looking at one returns its next deadline, and it is
// put in that tick's slot. A deadline only ever moves later, a frame or a
// sign of use at a time, except the token's (a fresh token may expire
// sooner), which at moves earlier. A deadline past the ring's span is
// looked at once the ring reaches it, and put further on.
//
// It is safe for concurrent use.
type dueRing struct {
	step int64 // ns per tick
	// base is the unix ns of tick 0.
	base int64

	mu sync.Mutex
	// slots[t % len] holds the connections due on tick t, for the ticks
	// from next on; a connection whose due is another tick (it was put
	// earlier since, or it ended) is left over, and skipped.
	slots [][]*conn
	// stale counts each slot's left-overs; a slot that is half left-overs
	// is compacted, so that an ended connection is let go soon, not held
	// until its tick (up to the ring's span), for the price of a walk of
	// the slot per as many ends as it has live connections.
	stale []int
	// next is the tick to look at next.
	next int64
	// spare is a slot's emptied slice, kept for the next slot taken.
	spare []*conn
}

// maxDueSlots bounds the ring: with a step of at most 500ms, 34
// minutes; a TTL longer than that has its connections looked at once per
// span.
const maxDueSlots = 4096

// newDueRing returns a ring that looks at connections every step,
// starting at now (unix ns), and spans at least span.
func newDueRing(step, span time.Duration, now int64) *dueRing {
	n := min(max(int(span/step)+2, 2), maxDueSlots)
	return &dueRing{
		step:  int64(step),
		base:  now - int64(step),
		slots: make([][]*conn, n),
		stale: make([]int, n),
		next:  1,
	}
}

// at makes sure c is looked at no later than the first tick at or after
// t (unix ns): the next tick if t has passed, the last of the ring's span
// if t is beyond it.
func (d *dueRing) at(c *conn, t int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	tick := (t - d.base + d.step - 1) / d.step
	if t < d.base {
		tick = d.next
	}
	tick = min(max(tick, d.next), d.next+int64(len(d.slots))-1)
	// A connection that ended is not put back (ended, which its end calls
	// after closing it, has taken it out or will).
	if c.due != 0 && c.due <= tick || c.closed.Load() {
		return
	}
	was := c.due
	c.due = tick
	i := tick % int64(len(d.slots))
	d.slots[i] = append(d.slots[i], c)
	if was != 0 {
		d.leftOver(was)
	}
}

// ended takes c out of the ring: its connection ended.
func (d *dueRing) ended(c *conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c.due == 0 {
		return
	}
	was := c.due
	c.due = 0
	d.leftOver(was)
}

// leftOver counts a left-over entry in tick's slot, and compacts the slot
// once half of it is left-overs. The caller holds d.mu.
func (d *dueRing) leftOver(tick int64) {
	i := tick % int64(len(d.slots))
	d.stale[i]++
	if 2*d.stale[i] < len(d.slots[i]) {
		return
	}
	d.slots[i] = slices.DeleteFunc(d.slots[i], func(c *conn) bool { return c.due != tick || c.closed.Load() })
	d.stale[i] = 0
}

// take returns the connections due on the next tick, if its time (at or
// before now, unix ns) has come, appended to buf; ok is false while it has
// not. Each returned is due on no tick until at puts it on one again.
func (d *dueRing) take(now int64, buf []*conn) (_ []*conn, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	tick := d.next
	if d.base+tick*d.step > now {
		return buf, false
	}
	i := tick % int64(len(d.slots))
	slot := d.slots[i]
	d.slots[i] = d.spare
	d.stale[i] = 0
	d.next++
	for j, c := range slot {
		if c.due == tick && !c.closed.Load() {
			c.due = 0
			buf = append(buf, c)
		}
		slot[j] = nil
	}
	d.spare = slot[:0]
	return buf, true
}

// run looks at connections as their ticks come, every step, until ctx is
// canceled: look(c, now) ends c, or returns when to look at it next. A
// run late by several steps (a slowed machine) looks at every tick it
// missed, in order.
func (d *dueRing) run(ctx context.Context, look func(c *conn, now int64) (next int64, live bool)) {
	t := time.NewTicker(time.Duration(d.step))
	defer t.Stop()
	var due []*conn
	for {
		select {
		case <-ctx.Done():
			return
		case tm := <-t.C:
			now := tm.UnixNano()
			for ok := true; ok; {
				due, ok = d.take(now, due[:0])
				for i, c := range due {
					if next, live := look(c, now); live {
						d.at(c, next)
					}
					due[i] = nil
				}
			}
		}
	}
}

// lookStep is how often the gateway looks at the connections due:
// often enough to see a dead one soon after its TTL.
func lookStep(ttl time.Duration) time.Duration {
	return min(max(ttl/10, 50*time.Millisecond), 500*time.Millisecond)
}

// lookAt ends c if it was silent for the TTL (unless its socket is
// stalled: it is not read then, and the write timeout judges it instead)
// or its token expired, and marks it idle if it was not used for
// AwayAfter; it returns when to look at c next, unless it ended c.
func (s *Service) lookAt(c *conn, now int64) (next int64, live bool) {
	if c.closed.Load() {
		return 0, false
	}
	stalled := c.sock.Stalled() != 0
	if now-c.lastFrame.Load() > int64(s.cfg.ConnTTL) && !stalled {
		s.end(c, endDead, 0, "no frame for the connection TTL")
		return 0, false
	}
	if exp := c.expires.Load(); exp != 0 && now >= exp {
		reason := "token expired"
		if s.proxy != nil && s.proxy.has(c) {
			reason = closeSessionExpired
		}
		s.end(c, endClean, ws.StatusPolicyViolation, reason)
		return 0, false
	}
	if now-c.lastActivity.Load() > int64(s.cfg.AwayAfter) {
		s.keys.setIdle(c, true)
	}
	return s.nextLook(c, now, stalled), true
}

// nextLook returns when c's first deadline may come, as it stands at now:
// the end of its TTL (a stalled socket's counts again once it drains,
// from then: looked at a TTL from now, it has not begun sooner), its
// token's expiry, and, while it is in use, the end of AwayAfter (one that
// could not be marked idle is looked at again AwayAfter later).
func (s *Service) nextLook(c *conn, now int64, stalled bool) int64 {
	ttl, away := int64(s.cfg.ConnTTL), int64(s.cfg.AwayAfter)
	next := c.lastFrame.Load() + ttl + 1
	if stalled {
		next = now + ttl
	}
	if exp := c.expires.Load(); exp != 0 {
		next = min(next, exp)
	}
	if !c.idle.Load() {
		at := c.lastActivity.Load() + away + 1
		if at <= now {
			at = now + away
		}
		next = min(next, at)
	}
	return next
}
