package gateway

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// userState is what the registrar keeps of a user with connections here,
// and the one writer of the user's record from this gateway.
type userState struct {
	id string
	// at is the state's index in the registrar's all; guarded by the
	// registrar's mutex.
	at int32
	// running says the user's writer runs; guarded by mu. (Beside at, in
	// what would be its padding: a userState keeps to its 240-byte size
	// class.)
	running bool

	mu sync.Mutex
	// conns are the user's connections here that the record must name:
	// a few at most, and most often one, which a slice holds in a
	// fraction of a map's memory.
	conns []*conn
	// gone are connections the record must no longer name, with the
	// lease they were held under and when they were last seen (unix ms).
	gone map[string]goneConn
	// chosen is a status chosen here and not yet written; empty if none.
	chosen presence.Status
	// custom is a custom status set here and not yet written: nil if
	// none, noCustom for a clearing. (One pointer, not a pointer and a
	// flag: a userState then keeps to its 240-byte size class.)
	custom *presence.Custom
	// gen counts changes asked for; written is the gen of the newest state
	// written.
	gen, written uint64
	waiters      []waiter
	// cache is the writer's copy of the record; only the running writer
	// touches it, and dropCaches while no writer runs.
	cache presence.Cached
	// wrote is when the writer last stopped (unix ns).
	wrote int64
	// self is the user's own state at the newest revision of the record
	// the writer wrote or read. A connection not yet in the registry
	// misses the self events of that time (they go through NATS, and the
	// dispatcher finds it nowhere), so it is given this when it is listed.
	self selfState
}

// selfState is a user's own state at a revision of the user's record.
type selfState struct {
	rev     uint64
	status  presence.Status
	devices int
	custom  *presence.Custom
}

// cacheKeep is how long a user's writer keeps its copy of the record after
// its last write. Most users, once connected, are not written again for
// minutes (until they go idle or close): their copy, a third of what a
// connection costs the gateway, is dropped, and their next write reads the
// record first.
const cacheKeep = 30 * time.Second

type goneConn struct {
	key      presence.LeaseConn
	lastSeen int64
}

type waiter struct {
	gen uint64
	ch  chan presence.Write
}

// writersKept is how many free writers the registrar keeps for the next
// writes. A writer's stack grows to what a compare-and-set write takes;
// a goroutine started for each write grew it each time, about 3% of a
// gateway's CPU at 1,000 writes a second. Beyond this many, a writer
// that becomes free ends, so that a burst of writes (every connection
// registered again) leaves no stacks behind.
const writersKept = 4

// lockUser returns the state of a user, made if need be, with its mutex
// held. The registrar's mutex is taken first, then the user's: forget
// takes them in the same order, so a state is never dropped while a
// connection is being added to it.
func (r *registrar) lockUser(id string) *userState {
	r.mu.Lock()
	defer r.mu.Unlock()
	us := r.users[id]
	if us == nil {
		us = &userState{id: id, at: int32(len(r.all))}
		r.users[id] = us
		r.all = append(r.all, us)
	}
	us.mu.Lock()
	return us
}

// forget drops the state of a user with nothing left here.
func (r *registrar) forget(us *userState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	us.mu.Lock()
	defer us.mu.Unlock()
	if us.running || us.written != us.gen || len(us.conns) > 0 || len(us.gone) > 0 || us.chosen != "" || us.custom != nil || len(us.waiters) > 0 {
		return
	}
	if r.users[us.id] == us {
		delete(r.users, us.id)
		last := r.all[len(r.all)-1]
		r.all[us.at], last.at = last, us.at
		r.all[len(r.all)-1] = nil
		r.all = r.all[:len(r.all)-1]
	}
}

// userStates returns the states of the users known here now. Walks of
// every user take each state's own mutex from this copy, not under the
// registrar's: that mutex is taken by every registration, end and self
// event, which a walk of 100,000 users under it held up for 4 to 9 ms
// (the copy, under 1 ms). A state made after the copy is of a connection
// registered after the walk began; one forgotten after it had nothing
// left here.
func (r *registrar) userStates() []*userState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

// askLocked asks the user's writer to write the user's state as it is
// now, and returns where the write will be told; the caller holds us.mu.
func (r *registrar) askLocked(us *userState) <-chan presence.Write {
	us.gen++
	ch := make(chan presence.Write, 1)
	us.waiters = append(us.waiters, waiter{gen: us.gen, ch: ch})
	r.kickLocked(us)
	return ch
}

// changedLocked tells the user's writer that its state changed; the
// caller holds us.mu.
func (r *registrar) changedLocked(us *userState) {
	us.gen++
	r.kickLocked(us)
}

// kickLocked starts the user's writer unless it runs.
func (r *registrar) kickLocked(us *userState) {
	if us.running {
		return
	}
	us.running = true
	if !r.writers.run(us) {
		us.running = false
	}
}

// write writes the user's state until it has written the newest one: each
// write takes whatever changed since the previous one.
func (r *registrar) write(us *userState) {
	backoff := 50 * time.Millisecond
	for {
		us.mu.Lock()
		if us.written == us.gen {
			us.running = false
			us.wrote = nowNano()
			us.mu.Unlock()
			r.forget(us)
			return
		}
		gen := us.gen
		entries, gone, chosen, epoch := r.desiredLocked(us)
		custom := us.custom
		us.mu.Unlock()

		w, err := r.writeOnce(us, entries, gone, chosen, epoch, custom)
		if err != nil {
			if r.ctx.Err() != nil || r.nc.IsClosed() {
				// Stopping, or the connection is gone for good: the end
				// of the lease takes out what was not written.
				us.mu.Lock()
				us.running = false
				us.mu.Unlock()
				return
			}
			if !errors.Is(err, errLeaseLost) {
				r.log.Warn("write status record", "user_id", us.id, "err", err)
			}
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		// Noted before its self event goes out: a connection listed after
		// the event reached the registry finds the state here.
		us.mu.Lock()
		us.keepSelfLocked(selfState{rev: w.Rev, status: w.Next.Status, devices: w.Next.Devices, custom: w.Next.Custom})
		us.mu.Unlock()
		r.publish(us.id, &w)
		r.removeKeys(gone)

		us.mu.Lock()
		us.written = gen
		for id, g := range gone {
			if cur, ok := us.gone[id]; ok && cur == g {
				delete(us.gone, id)
			}
		}
		if len(us.gone) == 0 {
			us.gone = nil // an idle user holds no map it does not need
		}
		if chosen != "" && us.chosen == chosen {
			us.chosen = ""
		}
		if custom != nil && us.custom == custom {
			us.custom = nil
		}
		kept := us.waiters[:0]
		for _, wt := range us.waiters {
			if wt.gen <= gen {
				wt.ch <- w
			} else {
				kept = append(kept, wt)
			}
		}
		clear(us.waiters[len(kept):])
		us.waiters = kept
		if len(kept) == 0 {
			us.waiters = nil
		}
		us.mu.Unlock()
	}
}

// learnSelf keeps ev, a self event of a user with connections here, as
// the user's own state if it is newer than the one kept: a write of
// another gateway's, a reaper's or the fanout's, which a connection not
// yet in the registry misses (listed).
func (r *registrar) learnSelf(ev *presence.SelfEvent) {
	r.mu.Lock()
	us := r.users[ev.UserID]
	r.mu.Unlock()
	if us == nil {
		return
	}
	us.mu.Lock()
	us.keepSelfLocked(selfState{rev: ev.Rev, status: ev.Status, devices: ev.Devices, custom: ev.Custom})
	us.mu.Unlock()
}

// keepSelfLocked keeps st as the user's own state if it is newer than the
// one kept; the caller holds us.mu.
func (us *userState) keepSelfLocked(st selfState) {
	if st.rev > us.self.rev {
		us.self = st
	}
}

// desiredLocked returns what the user's record must say of this gateway's
// connections: the entries it must hold (of connections held under the
// lease now held), those it must lose, and a chosen status to write. The
// caller holds us.mu.
func (r *registrar) desiredLocked(us *userState) (map[string]presence.ConnInfo, map[string]goneConn, presence.Status, string) {
	epoch, held := r.lease.epoch()
	entries := make(map[string]presence.ConnInfo, len(us.conns))
	for _, c := range us.conns {
		if !held || c.key.lease != epoch {
			continue // registered again under the new lease first
		}
		entries[c.connID] = presence.ConnInfo{
			Gateway: r.cfg.ID, Lease: c.key.lease, Device: c.device, Platform: c.key.platform.Platform(), Since: c.since,
			Idle: c.key.idle, Closing: c.key.closedAt != 0, ClosedAt: c.key.closedAt, Background: c.key.background != 0,
		}
	}
	gone := make(map[string]goneConn, len(us.gone))
	for id, g := range us.gone {
		gone[id] = g
	}
	return entries, gone, us.chosen, epoch
}

// writeOnce makes one compare-and-set write of the user's record, from
// the writer's cache; entries are held under the lease epoch. When
// custom is not nil, it is the custom status to write (noCustom: none);
// the timer of its expiry is written first, so that a custom status
// written always has one (a timer left by a write that failed ends to no
// effect).
func (r *registrar) writeOnce(us *userState, entries map[string]presence.ConnInfo, gone map[string]goneConn, chosen presence.Status, epoch string,
	custom *presence.Custom) (presence.Write, error) {
	if len(entries) > 0 {
		// No entry is written unless the lease it is held under is
		// certainly alive: a write after it ended would name a
		// connection nobody will end. The lease the entries were chosen
		// under, not the one held now: a new one taken meanwhile does not
		// vouch for them.
		if !r.lease.waitFresh(r.ctx, epoch) {
			return presence.Write{}, errLeaseLost
		}
	}
	ctx, cancel := context.WithTimeout(r.ctx, requestTimeout)
	defer cancel()
	if custom != nil && custom != noCustom && custom.ExpiresAt != 0 {
		if err := r.store.SetCustomTimer(ctx, us.id, custom.ExpiresAt); err != nil {
			r.metrics.kvErrors.WithLabelValues("timer").Inc()
			return presence.Write{}, err
		}
		r.metrics.kvWrites.WithLabelValues("timer").Inc()
	}
	start := time.Now()
	w, err := r.store.WriteStatus(ctx, us.id, &us.cache, func(rec *presence.Record) error {
		changed := false
		for id, ci := range entries {
			if cur, ok := rec.Conns[id]; !ok || cur != ci {
				rec.SetConn(id, ci)
				changed = true
			}
		}
		for id, g := range gone {
			if cur, ok := rec.Conns[id]; ok && cur.Gateway == g.key.Gateway && cur.Lease == g.key.Epoch {
				rec.RemoveConn(id, g.lastSeen)
				changed = true
			}
		}
		if chosen != "" && rec.ChosenStatus() != chosen {
			rec.Chosen = chosen
			changed = true
		}
		if custom != nil {
			next := custom
			if next == noCustom {
				next = nil
			}
			if !rec.Custom.Equal(next) {
				rec.Custom = next
				changed = true
			}
		}
		if !changed {
			return presence.ErrNoChange
		}
		return nil
	})
	r.metrics.kvLatency.WithLabelValues("update_status").Observe(time.Since(start).Seconds())
	if err != nil {
		r.metrics.kvErrors.WithLabelValues("status").Inc()
		return w, err
	}
	if w.Written {
		r.metrics.kvWrites.WithLabelValues("status").Inc()
	}
	return w, nil
}

// publish publishes the events a write calls for; the self event for
// this gateway is handed to the user's connections here in process (see
// listed for one not yet in the registry).
func (r *registrar) publish(userID string, w *presence.Write) {
	n, err := r.events.Publish(userID, w, true)
	r.metrics.eventsOut.Add(float64(n))
	if err != nil {
		r.log.Warn("publish events", "user_id", userID, "err", err)
	}
}

// dropCaches drops the copy of the record of every user whose writer has
// not written for cacheKeep by now, and returns how many it dropped.
func (r *registrar) dropCaches(now time.Time) int {
	before := now.Add(-cacheKeep).UnixNano()
	n := 0
	for _, us := range r.userStates() {
		us.mu.Lock()
		if !us.running && us.cache.Valid && us.wrote < before {
			us.cache = presence.Cached{}
			n++
		}
		us.mu.Unlock()
	}
	return n
}
