package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/internal/sleep"
	"github.com/greendot/greendot/pkg/presence"
)

// registrar is the one place that talks to NATS about the gateway's
// connections: the gateway's lease, each connection's key and its entry in
// its user's status record, the status users choose, and the events each
// of those writes calls for.
//
// NATS hears of a connection only when something about it changes:
//
//   - register creates its key under the gateway's lease, then adds it to
//     its user's record: the key always exists before the record names it,
//     so the end of the lease finds every connection it must end.
//   - it turning idle (the client said so, or it was not used for
//     AwayAfter) or active again rewrites its record entry, and its key.
//   - its end takes it out of the record and then removes its key: at
//     once for a dead connection, after the offline grace for a clean
//     close, so that a reload does not flap.
//   - heartbeats never touch NATS: the gateway finds silent connections
//     itself. Its lease, refreshed about every second, is all that keeps
//     its connections alive; when the gateway dies, the lease expires and
//     a reaper ends them.
//
// Each user with connections here has one writer, which writes the
// user's record by compare-and-set from its cached copy (reading it again
// only when another writer came first), one write for whatever changed
// meanwhile, and then publishes the events the write calls for, at once.
//
// It is safe for concurrent use.
type registrar struct {
	nc *nats.Conn
	// events publishes the events of the writes, and reports them to the
	// fanouts.
	events  *presence.Publisher
	store   *presence.Store
	asyncJS jetstream.JetStream
	cfg     *Config
	metrics *gatewayMetrics
	log     *slog.Logger
	lease   *lease

	mu    sync.Mutex
	users map[string]*userState
	// all holds the same states as users, for walks: a copy of a slice
	// is a fraction of a map's iteration.
	all []*userState
	// grace holds the clean closes living out the offline grace.
	grace deadlines[*conn]

	// onEnd is told of each connection that ended for good (its room
	// keys go), and onNewLease of each new lease taken after one was lost
	// (room keys are written again under it). Set before start.
	onEnd      func(c *conn)
	onNewLease func()
	// onReplaced is told when a lease lost is found to have gone with
	// its bucket, created again since the gateway opened it (see
	// presence.Store.Replaced): the gateway must stop. Set before start.
	onReplaced func(err error)

	// reregistering is set while connections are registered again under
	// a new lease.
	reregistering atomic.Bool

	// ctx ends when the registrar stops; writers stop retrying then.
	ctx    context.Context
	cancel context.CancelFunc
	tasks  tasks
	// writers run the users' writers (write), on goroutines kept between
	// writes.
	writers *workerPool[*userState, struct{}]
}

// connKey is a connection's registration, as its registrar knows it. Its
// fields are guarded by the userState's mutex.
type connKey struct {
	lease    string // the epoch its key was created under
	closedAt int64  // unix ms of a clean close; 0 while open
	idle     bool
	ended    bool // taken out of the user's state
	// listed is set once the connection is in the gateway's registry,
	// where a self event handed over in process reaches it.
	listed bool
}

// userState is what the registrar keeps of a user with connections here,
// and the one writer of the user's record from this gateway.
type userState struct {
	id string
	// at is the state's index in the registrar's all; guarded by the
	// registrar's mutex.
	at int

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
	// gen counts changes asked for; written is the gen of the newest state
	// written.
	gen, written uint64
	waiters      []waiter
	running      bool
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

// tasks tracks goroutines that must finish before the registrar stops.
// Once closed, it starts nothing more. It is safe for concurrent use.
type tasks struct {
	mu     sync.Mutex
	wg     sync.WaitGroup
	closed bool
}

// Go runs fn in a goroutine and reports true, or reports false once the
// group is closed.
func (t *tasks) Go(fn func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Go(fn)
	return true
}

// close stops new work and waits for what runs.
func (t *tasks) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}

// newRegistrar returns the registrar of a gateway over store; nc carries
// the events it publishes.
func newRegistrar(nc *nats.Conn, store *presence.Store, cfg Config, addr string, m *gatewayMetrics, log *slog.Logger) (*registrar, error) {
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.KVMaxPending),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, msg *nats.Msg, err error) {
			// Only the key's copy of idle is written this way: the
			// record holds the truth.
			m.kvErrors.WithLabelValues("update").Inc()
			log.Debug("update connection key", "subject", msg.Subject, "err", err)
		}))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &registrar{
		nc:      nc,
		events:  presence.NewPublisher(nc),
		store:   store,
		asyncJS: js,
		cfg:     &cfg,
		metrics: m,
		log:     log,
		lease:   newLease(store, log, cfg.ID, addr, cfg.LeaseTTL),
		users:   make(map[string]*userState),
		ctx:     ctx,
		cancel:  cancel,
	}
	r.writers = newWorkerPoolKeeping(math.MaxInt, writersKept, func() struct{} { return struct{}{} },
		func(us *userState, _ struct{}) { r.write(us) })
	return r, nil
}

// writersKept is how many free writers the registrar keeps for the next
// writes. A writer's stack grows to what a compare-and-set write takes;
// a goroutine started for each write grew it each time, about 3% of a
// gateway's CPU at 1,000 writes a second. Beyond this many, a writer
// that becomes free ends, so that a burst of writes (every connection
// registered again) leaves no stacks behind.
const writersKept = 4

// start takes the gateway's lease.
func (r *registrar) start(ctx context.Context) error {
	epoch, err := r.lease.take(ctx)
	if err != nil {
		return fmt.Errorf("take the gateway's lease: %w", err)
	}
	r.log.Info("gateway lease taken", "lease", presence.LeaseKey(r.cfg.ID, epoch), "ttl", r.cfg.LeaseTTL.String())
	return nil
}

// ready reports whether connections can be registered now.
func (r *registrar) ready() error {
	if _, held := r.lease.epoch(); !held || r.reregistering.Load() {
		return fmt.Errorf("%w: %v", ErrUnavailable, errLeaseLost)
	}
	return nil
}

// inFlight returns how many asynchronous key writes wait for their
// acknowledgement.
func (r *registrar) inFlight() int { return r.asyncJS.PublishAsyncPending() }

// lockUser returns the state of a user, made if need be, with its mutex
// held. The registrar's mutex is taken first, then the user's: forget
// takes them in the same order, so a state is never dropped while a
// connection is being added to it.
func (r *registrar) lockUser(id string) *userState {
	r.mu.Lock()
	defer r.mu.Unlock()
	us := r.users[id]
	if us == nil {
		us = &userState{id: id, at: len(r.all)}
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
	if us.running || us.written != us.gen || len(us.conns) > 0 || len(us.gone) > 0 || us.chosen != "" || len(us.waiters) > 0 {
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

// register creates the key and the record entry of a new connection,
// before its upgrade is answered. It returns the user's record after the
// change, and its revision. A connection that fails to register leaves
// nothing behind.
func (r *registrar) register(ctx context.Context, c *conn) (presence.Record, uint64, error) {
	epoch, held := r.lease.epoch()
	if !held {
		return presence.Record{}, 0, fmt.Errorf("%w: %v", ErrUnavailable, errLeaseLost)
	}
	key := presence.LeaseConn{Gateway: r.cfg.ID, Epoch: epoch, UserID: c.userID, ConnID: c.connID}
	start := time.Now()
	_, err := r.store.CreateLeaseConn(ctx, key, r.connRecord(c, epoch, false))
	r.metrics.kvLatency.WithLabelValues("create_conn").Observe(time.Since(start).Seconds())
	r.metrics.kvWrites.WithLabelValues("create").Inc()
	if err != nil {
		r.metrics.kvErrors.WithLabelValues("create").Inc()
		// The write may have been stored though its answer was lost.
		_ = r.store.RemoveLeaseConn(context.WithoutCancel(ctx), key)
		return presence.Record{}, 0, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	us := r.lockUser(c.userID)
	c.us = us
	c.key = connKey{lease: epoch}
	us.conns = append(us.conns, c)
	w := r.askLocked(us)
	us.mu.Unlock()
	select {
	case res := <-w:
		if ci, ok := res.Next.Conns[c.connID]; ok && ci.Lease == epoch {
			return res.Next, res.Rev, nil
		}
		// The lease was lost meanwhile: the client tries again.
		r.end(c, c.since)
		return presence.Record{}, 0, fmt.Errorf("%w: %v", ErrUnavailable, errLeaseLost)
	case <-ctx.Done():
		// It may still be written: take it out again, for good.
		r.end(c, c.since)
		return presence.Record{}, 0, fmt.Errorf("%w: register connection: %v", ErrUnavailable, ctx.Err())
	}
}

// listed notes that c, registered, is now in the gateway's registry (see
// listedLocked), and returns the user's own state to show it: st, what
// its registration wrote, unless the writer wrote or read a newer
// revision since. While c was not listed, the self events of the user's
// writes went through NATS, and one the dispatcher handed out before c
// was in the registry missed it; the writer notes each write's state
// before publishing its events, so c gets the newest either here or from
// the registry.
func (r *registrar) listed(c *conn, st selfState) selfState {
	c.us.mu.Lock()
	defer c.us.mu.Unlock()
	c.key.listed = true
	if c.us.self.rev > st.rev {
		return c.us.self
	}
	return st
}

// connRecord returns the value of c's key under epoch.
func (r *registrar) connRecord(c *conn, epoch string, idle bool) presence.ConnRecord {
	return presence.ConnRecord{Gateway: r.cfg.ID, Lease: epoch, Device: c.device, Since: c.since, Idle: idle}
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
		handOver := listedLocked(us)
		us.mu.Unlock()

		w, err := r.writeOnce(us, entries, gone, chosen, epoch)
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
		us.keepSelfLocked(selfState{rev: w.Rev, status: w.Next.Status, devices: w.Next.Devices})
		us.mu.Unlock()
		r.publish(us.id, &w, handOver)
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
	us.keepSelfLocked(selfState{rev: ev.Rev, status: ev.Status, devices: ev.Devices})
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
			Gateway: r.cfg.ID, Lease: c.key.lease, Device: c.device, Since: c.since,
			Idle: c.key.idle, Closing: c.key.closedAt != 0, ClosedAt: c.key.closedAt,
		}
	}
	gone := make(map[string]goneConn, len(us.gone))
	for id, g := range us.gone {
		gone[id] = g
	}
	return entries, gone, us.chosen, epoch
}

// writeOnce makes one compare-and-set write of the user's record, from
// the writer's cache; entries are held under the lease epoch.
func (r *registrar) writeOnce(us *userState, entries map[string]presence.ConnInfo, gone map[string]goneConn, chosen presence.Status, epoch string) (presence.Write, error) {
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

// listedLocked reports whether every connection of the user here is in
// the registry, so that the self event of a write reaches each of them
// when it is handed over in process (presence.Publisher.HandOver). One
// still being registered is not yet: the self events of writes made
// meanwhile go through NATS, as those of other gateways do. The caller
// holds us.mu.
func listedLocked(us *userState) bool {
	for _, c := range us.conns {
		if !c.key.listed {
			return false
		}
	}
	return true
}

// publish publishes the events a write calls for; with handOver, the self
// event for this gateway is handed over in process (see listedLocked).
func (r *registrar) publish(userID string, w *presence.Write, handOver bool) {
	n, err := r.events.Publish(userID, w, handOver)
	r.metrics.eventsOut.Add(float64(n))
	if err != nil {
		r.log.Warn("publish events", "user_id", userID, "err", err)
	}
}

// removeKeys removes the keys of connections the record no longer names.
// One that fails to go is removed with its lease.
func (r *registrar) removeKeys(gone map[string]goneConn) {
	for _, g := range gone {
		r.removeKey(g.key)
	}
}

// removeKey removes a connection's key; one that fails to go is removed
// with its lease.
func (r *registrar) removeKey(key presence.LeaseConn) {
	ctx, cancel := context.WithTimeout(r.ctx, requestTimeout)
	err := r.store.RemoveLeaseConn(ctx, key)
	cancel()
	r.metrics.kvWrites.WithLabelValues("remove").Inc()
	if err != nil {
		r.metrics.kvErrors.WithLabelValues("remove").Inc()
		r.log.Warn("remove connection key", "user_id", key.UserID, "conn_id", key.ConnID, "err", err)
	}
}

// setIdle marks a connection idle or active again, and reports whether
// that changed it. The record and the key are written in the background.
func (r *registrar) setIdle(c *conn, idle bool) bool {
	us := c.us
	if us == nil || c.idle.Load() == idle {
		return false
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	if c.key.idle == idle || c.key.ended || c.key.closedAt != 0 {
		return false
	}
	c.key.idle = idle
	c.idle.Store(idle)
	r.changedLocked(us)
	// The key says it too, for operators, but only under the lease held:
	// a key under a lost lease may be removed already, and a put would
	// make it again, for nobody to remove. Registered again under the new
	// lease, its key there says what c is then (reregisterConn).
	if r.lease.holds(c.key.lease) {
		r.putKeyLocked(c)
	}
	return true
}

// putKeyLocked rewrites c's key under its lease with what it says of c
// now; nothing waits for it. The caller holds c.us.mu.
func (r *registrar) putKeyLocked(c *conn) {
	key := presence.LeaseConn{Gateway: r.cfg.ID, Epoch: c.key.lease, UserID: c.userID, ConnID: c.connID}
	rec := r.connRecord(c, c.key.lease, c.key.idle)
	if msg, err := presence.LeaseConnMsg(key, &rec); err == nil {
		if _, err := r.asyncJS.PublishMsgAsync(msg); err == nil {
			r.metrics.kvWrites.WithLabelValues("update").Inc()
		}
	}
}

// choose takes the status the user of c chose: it is written with the
// user's next write, and a choice made after it replaces it. It returns
// where that write will be told.
func (r *registrar) choose(c *conn, st presence.Status) <-chan presence.Write {
	us := c.us
	us.mu.Lock()
	defer us.mu.Unlock()
	us.chosen = st
	return r.askLocked(us)
}

// close marks a connection whose socket closed cleanly closing, for the
// offline grace: a reload within it does not flap. The grace's end takes
// it out (see run).
func (r *registrar) close(c *conn) {
	if r.cfg.OfflineGrace <= 0 {
		r.end(c, nowNano()/1e6)
		return
	}
	us := c.us
	if us == nil {
		return
	}
	us.mu.Lock()
	if c.key.ended || c.key.closedAt != 0 {
		us.mu.Unlock()
		return
	}
	now := time.Now()
	c.key.closedAt = now.UnixMilli()
	r.changedLocked(us)
	us.mu.Unlock()
	r.mu.Lock()
	r.grace.add(now.Add(r.cfg.OfflineGrace), c)
	r.mu.Unlock()
}

// end takes a connection out of its user's record, at once, and then
// removes its key. lastSeen is when it was last seen (unix ms).
func (r *registrar) end(c *conn, lastSeen int64) {
	us := c.us
	if us == nil {
		return // never registered
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	if c.key.ended {
		return
	}
	c.key.ended = true
	if c.key.closedAt != 0 {
		lastSeen = c.key.closedAt
	}
	if i := slices.Index(us.conns, c); i >= 0 {
		us.conns = slices.Delete(us.conns, i, i+1)
	}
	if len(us.conns) == 0 {
		us.conns = nil
	}
	if c.key.lease != "" {
		if us.gone == nil {
			us.gone = make(map[string]goneConn)
		}
		us.gone[c.connID] = goneConn{
			key:      presence.LeaseConn{Gateway: r.cfg.ID, Epoch: c.key.lease, UserID: c.userID, ConnID: c.connID},
			lastSeen: lastSeen,
		}
	}
	r.changedLocked(us)
	if r.onEnd != nil {
		r.onEnd(c)
	}
}

// run keeps the lease and ends the clean closes whose grace is over,
// until ctx is canceled. When the lease is lost it takes a new one and
// registers every live connection again under it (reregister). The
// registry is not what it goes by: a connection registered and not yet
// in it is live too.
func (r *registrar) run(ctx context.Context) {
	t := time.NewTicker(min(r.lease.every, 250*time.Millisecond))
	defer t.Stop()
	lastRefresh, lastDrop := time.Time{}, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.endGraces(now)
			r.writers.sweep(now)
			if now.Sub(lastDrop) >= cacheKeep/2 {
				lastDrop = now
				r.dropCaches(now)
			}
			if now.Sub(lastRefresh) < r.lease.every {
				continue
			}
			lastRefresh = now
			err := r.lease.refresh(ctx)
			r.metrics.leaseRefreshes.Inc()
			switch {
			case errors.Is(err, errLeaseReleased):
				return
			case errors.Is(err, errLeaseLost):
				if r.reregistering.Load() {
					continue
				}
				r.metrics.leasesLost.Inc()
				r.log.Warn("gateway lease lost: taking a new one and registering every connection again")
				r.reregistering.Store(true)
				if !r.tasks.Go(func() {
					defer r.reregistering.Store(false)
					r.reregister(ctx)
				}) {
					r.reregistering.Store(false)
				}
			case err != nil && ctx.Err() == nil:
				r.metrics.kvErrors.WithLabelValues("lease").Inc()
				r.log.Warn("refresh gateway lease", "err", err)
			}
		}
	}
}

// endGraces ends the clean closes whose grace ended by now.
func (r *registrar) endGraces(now time.Time) {
	r.mu.Lock()
	due := r.grace.due(now)
	r.mu.Unlock()
	for _, c := range due {
		r.end(c, 0)
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

// closing returns how many clean closes live out their grace.
func (r *registrar) closing() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grace.len()
}

// reregister takes a new lease and registers every live connection again
// under it, MaxRegistering at once; the gateway is not ready meanwhile.
// Clean closes in their grace are ended: the end of the old lease ended
// them already.
func (r *registrar) reregister(ctx context.Context) {
	if r.storeReplaced(ctx) {
		return
	}
	epoch, err := r.lease.take(ctx)
	if err != nil {
		return
	}
	if r.onNewLease != nil {
		r.onNewLease()
	}
	r.mu.Lock()
	closing := r.grace.all()
	r.mu.Unlock()
	for _, c := range closing {
		r.end(c, 0)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.cfg.MaxRegistering)
	n := 0
	for _, c := range r.conns() {
		if c.closed.Load() {
			continue
		}
		n++
		g.Go(func() error {
			r.reregisterConn(gctx, c, epoch)
			return nil
		})
	}
	_ = g.Wait()
	r.metrics.reregistered.Add(float64(n))
	r.log.Info("connections registered again under a new lease", "conns", n, "lease", presence.LeaseKey(r.cfg.ID, epoch))
}

// storeReplaced waits until every bucket can be looked up, and reports
// whether one was created again since the gateway opened it, as when NATS
// comes back without its storage: then the revisions the gateway holds
// (of its users' records, its watched users' states, its rooms) are
// unrelated to the buckets', and it tells onReplaced instead of taking a
// new lease and registering its connections there. It reports true also
// when ctx ends.
func (r *registrar) storeReplaced(ctx context.Context) bool {
	backoff := 100 * time.Millisecond
	for {
		qctx, cancel := context.WithTimeout(ctx, requestTimeout)
		replaced, err := r.store.Replaced(qctx)
		cancel()
		switch {
		case replaced:
			r.log.Error("the buckets were replaced since the gateway started: stopping", "err", err)
			r.onReplaced(err)
			return true
		case err == nil:
			return false
		case ctx.Err() != nil:
			return true
		}
		r.log.Warn("look the buckets up before taking a new lease", "err", err, "retry_in", backoff.String())
		if sleep.For(ctx, backoff) != nil {
			return true
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// conns returns the connections registered here that have not ended:
// those in the registry, and those between their registration and their
// entry in it, which a lease lost meanwhile must not leave behind.
func (r *registrar) conns() []*conn {
	var out []*conn
	for _, us := range r.userStates() {
		us.mu.Lock()
		out = append(out, us.conns...)
		us.mu.Unlock()
	}
	return out
}

// reregisterConn creates c's key under epoch and has its writer write it
// under it, trying until it is done, c ends, or the lease moves on again.
func (r *registrar) reregisterConn(ctx context.Context, c *conn, epoch string) {
	us := c.us
	us.mu.Lock()
	idle, old := c.key.idle, c.key.lease
	us.mu.Unlock()
	key := presence.LeaseConn{Gateway: r.cfg.ID, Epoch: epoch, UserID: c.userID, ConnID: c.connID}
	if !r.createKeyAgain(ctx, c, key, idle) {
		return
	}
	us.mu.Lock()
	if c.key.ended {
		us.mu.Unlock()
		// c ended while its key was created: its end removes only the key
		// it was held under, and no write names it under epoch, so this
		// one is left for nobody else to remove.
		r.removeKey(key)
		return
	}
	if c.key.lease != old {
		us.mu.Unlock()
		return
	}
	c.key.lease = epoch
	if c.key.idle != idle && r.lease.holds(epoch) {
		r.putKeyLocked(c) // it turned idle or active meanwhile (setIdle)
	}
	r.changedLocked(us)
	us.mu.Unlock()
}

// createKeyAgain creates c's key under a new lease, trying until it is
// done, c ends, or the lease moves on again. It reports whether the key
// was created.
func (r *registrar) createKeyAgain(ctx context.Context, c *conn, key presence.LeaseConn, idle bool) bool {
	backoff := 100 * time.Millisecond
	for {
		if cur, _ := r.lease.epoch(); cur != key.Epoch || c.closed.Load() || ctx.Err() != nil {
			return false
		}
		wctx, cancel := context.WithTimeout(ctx, requestTimeout)
		_, err := r.store.CreateLeaseConn(wctx, key, r.connRecord(c, key.Epoch, idle))
		cancel()
		r.metrics.kvWrites.WithLabelValues("create").Inc()
		if err == nil || errors.Is(err, jetstream.ErrKeyExists) {
			return true
		}
		r.metrics.kvErrors.WithLabelValues("create").Inc()
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// stop waits, at most until ctx ends, for every writer to have written;
// then it gives the lease up and stops. Connections that still live out
// their offline grace are handed to the lease: its last refresh lasts
// until the latest grace ends, and its end then ends them.
func (r *registrar) stop(ctx context.Context) {
	defer r.events.Close() // after the last writes: their events are reported too
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for r.writing() && !r.nc.IsClosed() {
		select {
		case <-ctx.Done():
			r.log.Warn("gateway stopping with connections not written; its lease's end will take them out")
			r.cancel()
			r.tasks.close()
			r.writers.stop()
			return
		case now := <-t.C:
			r.endGraces(now)
		}
	}
	r.mu.Lock()
	until := r.grace.last()
	r.mu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	var err error
	if until.IsZero() {
		err = r.lease.release(rctx)
	} else {
		err = r.lease.handOver(rctx, until)
	}
	cancel()
	if err != nil {
		r.log.Warn("give the gateway lease up", "err", err)
	}
	r.cancel()
	r.tasks.close()
	r.writers.stop()
}

// writing reports whether a writer has something left to write.
func (r *registrar) writing() bool {
	for _, us := range r.userStates() {
		us.mu.Lock()
		pending := us.written != us.gen
		us.mu.Unlock()
		if pending {
			return true
		}
	}
	return false
}

// deadlines holds things due at a time, earliest first. It is not safe for
// concurrent use.
type deadlines[T comparable] struct {
	items []deadline[T]
}

type deadline[T comparable] struct {
	at time.Time
	v  T
}

// add has v due at at.
func (d *deadlines[T]) add(at time.Time, v T) {
	d.items = append(d.items, deadline[T]{at, v})
	for i := len(d.items) - 1; i > 0 && d.items[i].at.Before(d.items[i-1].at); i-- {
		d.items[i], d.items[i-1] = d.items[i-1], d.items[i]
	}
}

// due removes and returns what is due by now.
func (d *deadlines[T]) due(now time.Time) []T {
	n := 0
	for n < len(d.items) && !d.items[n].at.After(now) {
		n++
	}
	if n == 0 {
		return nil
	}
	out := make([]T, n)
	for i := range n {
		out[i] = d.items[i].v
	}
	d.items = append(d.items[:0], d.items[n:]...)
	return out
}

// last returns when the latest thing is due; zero when there is none.
func (d *deadlines[T]) last() time.Time {
	if len(d.items) == 0 {
		return time.Time{}
	}
	return d.items[len(d.items)-1].at
}

// all removes and returns everything.
func (d *deadlines[T]) all() []T {
	out := make([]T, len(d.items))
	for i, it := range d.items {
		out[i] = it.v
	}
	d.items = d.items[:0]
	return out
}

// len returns how many things are held.
func (d *deadlines[T]) len() int { return len(d.items) }
