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
	// platform is the platform the client named at connect (?platform=),
	// which its key and its user's record carry; set before it registers.
	platform presence.PlatformCode
	// background is, once the client said its app went to the background,
	// the grace it lives out when its socket closes or dies, in ms.
	background uint32
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
	c.key = connKey{lease: epoch, platform: c.key.platform}
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

// listed returns the user's own state to show c, registered and now in
// the gateway's registry: st, what its registration wrote, unless the
// writer wrote or read a newer revision since. The self events of the
// user's writes here are handed to the connections in the registry; one
// handed out before c was in it missed c, but the writer notes each
// write's state before handing its events out, so c gets the newest
// either here or from the registry.
func (r *registrar) listed(c *conn, st selfState) selfState {
	c.us.mu.Lock()
	defer c.us.mu.Unlock()
	if c.us.self.rev > st.rev {
		return c.us.self
	}
	return st
}

// connRecord returns the value of c's key under epoch.
func (r *registrar) connRecord(c *conn, epoch string, idle bool) presence.ConnRecord {
	return presence.ConnRecord{Gateway: r.cfg.ID, Lease: epoch, Device: c.device, Platform: c.key.platform.Platform(), Since: c.since, Idle: idle,
		Background: c.key.background != 0}
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
	if !idle {
		c.key.background = 0 // active again: back from the background
	}
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

// setCustom takes the custom status the user of c set (nil clears it),
// as choose takes a status.
func (r *registrar) setCustom(c *conn, custom *presence.Custom) <-chan presence.Write {
	us := c.us
	us.mu.Lock()
	defer us.mu.Unlock()
	if custom == nil {
		custom = noCustom
	}
	us.custom = custom
	return r.askLocked(us)
}

// noCustom is the custom status of a userState's that says to clear it.
var noCustom = new(presence.Custom)

// setBackground marks a connection whose app went to the background:
// idle, and living out grace when its socket closes or dies. It reports
// whether the connection was still open. The record and the key are
// written in the background.
func (r *registrar) setBackground(c *conn, grace time.Duration) bool {
	us := c.us
	if us == nil {
		return false
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	if c.key.ended || c.key.closedAt != 0 {
		return false
	}
	ms := uint32(max(grace.Milliseconds(), 1))
	if c.key.background == ms && c.key.idle {
		return true
	}
	c.key.background, c.key.idle = ms, true
	c.idle.Store(true)
	r.changedLocked(us)
	if r.lease.holds(c.key.lease) {
		r.putKeyLocked(c)
	}
	return true
}

// close marks a connection whose socket closed cleanly closing, for the
// offline grace (a reload within it does not flap), or for its
// background grace. The grace's end takes it out (see run).
func (r *registrar) close(c *conn) {
	r.closeAt(c, time.Now(), true)
}

// died ends a connection whose socket went silent, last seen at lastSeen
// (unix ms): at once, unless its app went to the background, when it
// lives out its background grace from lastSeen, closing.
func (r *registrar) died(c *conn, lastSeen int64) {
	r.closeAt(c, time.UnixMilli(lastSeen), false)
}

// closeAt marks c closing since at, for its grace: a background
// connection's background grace, else (when offline is set) the offline
// grace; with no grace it ends c at once.
func (r *registrar) closeAt(c *conn, at time.Time, offline bool) {
	us := c.us
	if us == nil {
		return
	}
	us.mu.Lock()
	if c.key.ended || c.key.closedAt != 0 {
		us.mu.Unlock()
		return
	}
	var grace time.Duration
	if offline {
		grace = max(r.cfg.OfflineGrace, 0)
	}
	if c.key.background != 0 {
		grace = max(grace, time.Duration(c.key.background)*time.Millisecond)
	}
	if grace == 0 || !at.Add(grace).After(time.Now()) {
		us.mu.Unlock()
		r.end(c, at.UnixMilli())
		return
	}
	c.key.closedAt = at.UnixMilli()
	r.changedLocked(us)
	us.mu.Unlock()
	r.mu.Lock()
	r.grace.add(at.Add(grace), c)
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

// closing returns how many clean closes live out their grace.
func (r *registrar) closing() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grace.len()
}

// stop waits, at most until ctx ends, for every writer to have written;
// then it gives the lease up and stops. Connections that still live out
// their offline grace are handed to the lease: its last refresh lasts
// until the latest grace ends (a background grace only as long as the
// offline grace), and its end then ends them.
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
	// Not past the offline grace: the lease's end ends every connection
	// it holds, the clean closes with the background ones, which a stop
	// does not keep for their longer grace.
	if limit := time.Now().Add(max(r.cfg.OfflineGrace, 0)); until.After(limit) {
		until = limit
	}
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
