package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/presence"
)

// registrar is the one place that talks to NATS about a connection: its
// key in presence_conns and its entry in its user's status record, from
// registration to its end, and the status the user chooses on it.
//
// A connection's life in presence_conns and presence_status:
//
//   - register creates its key (with a TTL), then adds it to the user's
//     status record by compare-and-set: the key always exists before the
//     record names it.
//   - while frames arrive, the sweep refreshes the key's TTL, at most once
//     per min(5s, TTL/3), with an asynchronous compare-and-set publish on
//     the key's revision; acknowledgements come back in batches.
//   - activity and idleness rewrite the key at once, then write the record
//     (always, even when nothing in it changes) so that a reaper deciding
//     "away" from an older read of the key fails its compare-and-set.
//   - at the end, the key is either rewritten with the offline grace as its
//     TTL (a clean close) or purged (a dead connection); the reaper turns
//     its removal into the record losing the connection.
//   - a key write refused because the key is gone (it expired in a NATS
//     outage, or lost a race with its expiry) creates the key again and
//     adds it to the record again.
//
// It is safe for concurrent use.
type registrar struct {
	store   *presence.Store
	asyncJS jetstream.JetStream
	cfg     *Config
	metrics *gatewayMetrics
	log     *slog.Logger

	// inflight maps an asynchronous key write to its connection until the
	// write is acknowledged or fails.
	inflight sync.Map // *nats.Msg -> *conn

	// tasks are the connections' last key writes (settle) and the keys
	// created again after a failed refresh; wait waits for them.
	tasks tasks
}

// connKey is a connection's registration in NATS, as its registrar knows
// it.
type connKey struct {
	// mu is held while a write of the key is in flight, from the publish
	// to its acknowledgement, so that writes of one key are never
	// concurrent. The fields below it are guarded by it.
	mu     sync.Mutex
	rev    uint64 // the key's newest revision
	awayAt int64  // AwayAt of the newest key write, unix ms; 0 while idle
	idle   bool   // the client said idle
	// The asynchronous write in flight: when it was made, the away_at it
	// carries, and when it was published (unix ns), for the KV latency
	// metric.
	flightAt, flightAway, flightSent int64

	// writtenAt is the unix ns of the newest key write.
	writtenAt atomic.Int64
}

// tasks tracks background work that must finish before Serve returns.
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

// newRegistrar returns the registrar of a gateway over store, publishing
// key refreshes asynchronously on nc.
func newRegistrar(nc *nats.Conn, store *presence.Store, cfg Config, m *gatewayMetrics, log *slog.Logger) (*registrar, error) {
	r := &registrar{store: store, cfg: &cfg, metrics: m, log: log}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.KVMaxPending),
		jetstream.WithPublishAsyncTimeout(5*time.Second),
		jetstream.WithPublishAsyncAckHandler(r.refreshAcked),
		jetstream.WithPublishAsyncErrHandler(r.refreshFailed),
	)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	r.asyncJS = js
	return r, nil
}

// wait waits for the connections' last key writes; nothing new starts.
func (r *registrar) wait() { r.tasks.close() }

// inFlight returns how many asynchronous key writes wait for their
// acknowledgement.
func (r *registrar) inFlight() int { return r.asyncJS.PublishAsyncPending() }

// keyTTL is the TTL of a live connection's key: the connection TTL plus a
// second, so that a refresh sent right at the end of a heartbeat interval
// still finds the key. The gateway itself ends a connection after ConnTTL
// without a frame.
func (r *registrar) keyTTL() time.Duration { return r.cfg.ConnTTL + time.Second }

// refreshInterval is the least time between two writes of a connection key
// caused by heartbeats alone: min(5s, TTL/3).
func (r *registrar) refreshInterval() time.Duration {
	return min(5*time.Second, r.cfg.ConnTTL/3)
}

// sweepInterval is how often connections are checked for liveness and
// refresh: often enough to see a dead one soon after its TTL.
func (r *registrar) sweepInterval() time.Duration {
	return min(max(r.cfg.ConnTTL/10, 50*time.Millisecond), 500*time.Millisecond)
}

// record returns the connection's key value as of now; the caller holds
// c.key.mu.
func (r *registrar) record(c *conn) presence.ConnRecord {
	rec := presence.ConnRecord{
		Gateway:  r.cfg.ID,
		Device:   c.device,
		Since:    c.since,
		ActiveAt: c.lastActivity.Load() / 1e6,
		Idle:     c.key.idle,
	}
	if !c.key.idle {
		rec.AwayAt = rec.ActiveAt + r.cfg.AwayAfter.Milliseconds()
	}
	return rec
}

// register creates the key and the record entry of a new connection,
// before its upgrade is answered. It returns the user's record after the
// change, and its revision.
func (r *registrar) register(ctx context.Context, c *conn) (presence.Record, uint64, error) {
	c.key.mu.Lock()
	defer c.key.mu.Unlock()
	rec := r.record(c)
	start := time.Now()
	rev, err := r.store.CreateConn(ctx, c.userID, c.connID, rec, r.keyTTL())
	r.metrics.kvLatency.WithLabelValues("create_conn").Observe(time.Since(start).Seconds())
	r.metrics.kvWrites.WithLabelValues("create").Inc()
	if err != nil {
		r.metrics.kvErrors.WithLabelValues("create").Inc()
		return presence.Record{}, 0, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	c.key.rev, c.key.awayAt = rev, rec.AwayAt
	c.key.writtenAt.Store(nowNano())
	status, statusRev, err := r.addToRecord(ctx, c)
	if err != nil {
		_ = r.store.PurgeConn(context.WithoutCancel(ctx), c.userID, c.connID)
		return presence.Record{}, 0, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return status, statusRev, nil
}

// addToRecord writes the connection into its user's record, as it is now;
// the caller holds c.key.mu. It always writes, so that a concurrent
// decision made from an older read fails.
func (r *registrar) addToRecord(ctx context.Context, c *conn) (presence.Record, uint64, error) {
	start := time.Now()
	rec, rev, _, err := r.store.UpdateStatus(ctx, c.userID, func(rec *presence.Record) error {
		rec.SetConn(c.connID, presence.ConnInfo{
			Gateway: r.cfg.ID,
			Device:  c.device,
			Since:   c.since,
			Rev:     c.key.rev,
			Idle:    c.key.idle,
		})
		return nil
	})
	r.metrics.kvLatency.WithLabelValues("update_status").Observe(time.Since(start).Seconds())
	r.metrics.kvWrites.WithLabelValues("status").Inc()
	if err != nil {
		r.metrics.kvErrors.WithLabelValues("status").Inc()
	}
	return rec, rev, err
}

// writeKeyLocked writes the connection's key synchronously with a fresh
// TTL; the caller holds c.key.mu. A key that is gone is created again and
// put back in the record.
func (r *registrar) writeKeyLocked(ctx context.Context, c *conn) error {
	now := nowNano()
	rec := r.record(c)
	start := time.Now()
	rev, err := r.store.WriteConn(ctx, c.userID, c.connID, rec, r.keyTTL(), c.key.rev)
	r.metrics.kvLatency.WithLabelValues("write_conn").Observe(time.Since(start).Seconds())
	r.metrics.kvWrites.WithLabelValues("update").Inc()
	if presence.IsWrongLastSequence(err) {
		return r.recreateLocked(ctx, c)
	}
	if err != nil {
		r.metrics.kvErrors.WithLabelValues("update").Inc()
		return err
	}
	c.key.rev, c.key.awayAt = rev, rec.AwayAt
	c.key.writtenAt.Store(now)
	return nil
}

// recreateLocked creates the key of a live connection again after it was
// lost, and puts the connection back in the record; the caller holds
// c.key.mu.
//
// The key may not be lost at all: a write whose acknowledgement never came
// (a timeout while NATS was slow) may have been stored, so the key is there
// at a revision this gateway never learnt, and every write on the revision
// it knows fails. Then the key is written on the revision it has; left to
// fail, it would expire under a live connection.
func (r *registrar) recreateLocked(ctx context.Context, c *conn) error {
	now := nowNano()
	rec := r.record(c)
	rev, err := r.store.CreateConn(ctx, c.userID, c.connID, rec, r.keyTTL())
	r.metrics.kvWrites.WithLabelValues("create").Inc()
	if presence.IsWrongLastSequence(err) || errors.Is(err, jetstream.ErrKeyExists) {
		var cur uint64
		if _, cur, err = r.store.Conn(ctx, c.userID, c.connID); err == nil {
			rev, err = r.store.WriteConn(ctx, c.userID, c.connID, rec, r.keyTTL(), cur)
			r.metrics.kvWrites.WithLabelValues("update").Inc()
		}
	}
	if err != nil {
		r.metrics.kvErrors.WithLabelValues("create").Inc()
		return err
	}
	c.key.rev, c.key.awayAt = rev, rec.AwayAt
	c.key.writtenAt.Store(now)
	if _, _, err := r.addToRecord(ctx, c); err != nil {
		return err
	}
	// One line per connection at debug: after a NATS outage every
	// connection may take this path. greendot_gateway_kv_writes_total
	// {kind="create"} counts them.
	if r.log.Enabled(ctx, levelDebug) {
		r.log.LogAttrs(ctx, levelDebug, "connection key was gone: created it again", attrUser(c.userID), attrConn(c.connID))
	}
	return nil
}

// refresh sends an asynchronous write of the key with a fresh TTL, unless
// another write of it is in flight. c.key.mu stays held until the write is
// acknowledged or fails (refreshAcked, refreshFailed).
func (r *registrar) refresh(c *conn, now int64) {
	if !c.key.mu.TryLock() {
		return
	}
	if c.closed.Load() {
		c.key.mu.Unlock()
		return
	}
	rec := r.record(c)
	msg, err := presence.ConnMsg(c.userID, c.connID, &rec)
	if err != nil {
		c.key.mu.Unlock()
		return
	}
	c.key.flightAt, c.key.flightAway = now, rec.AwayAt
	r.inflight.Store(msg, c)
	c.key.flightSent = nowNano()
	if _, err := r.asyncJS.PublishMsgAsync(msg, presence.WriteConnOpts(r.keyTTL(), c.key.rev)...); err != nil {
		r.inflight.Delete(msg)
		c.key.mu.Unlock()
		r.metrics.kvErrors.WithLabelValues("refresh").Inc()
		return
	}
	r.metrics.kvWrites.WithLabelValues("refresh").Inc()
}

// refreshAcked takes the acknowledgement of an asynchronous key write. It
// runs on the NATS connection's reply goroutine and must not block.
func (r *registrar) refreshAcked(_ jetstream.JetStream, msg *nats.Msg, ack *jetstream.PubAck) {
	v, ok := r.inflight.LoadAndDelete(msg)
	if !ok {
		return
	}
	c := v.(*conn)
	r.metrics.refreshLatency.Observe(float64(nowNano()-c.key.flightSent) / 1e9)
	c.key.rev, c.key.awayAt = ack.Sequence, c.key.flightAway
	c.key.writtenAt.Store(c.key.flightAt)
	c.key.mu.Unlock()
}

// refreshFailed takes the failure of an asynchronous key write. A key that
// is gone is created again, off the reply goroutine; other failures (a
// timeout, a lost NATS connection) leave the next sweep to try again.
func (r *registrar) refreshFailed(_ jetstream.JetStream, msg *nats.Msg, err error) {
	v, ok := r.inflight.LoadAndDelete(msg)
	if !ok {
		return
	}
	c := v.(*conn)
	r.metrics.kvErrors.WithLabelValues("refresh").Inc()
	if !presence.IsWrongLastSequence(err) || c.closed.Load() {
		c.key.mu.Unlock()
		return
	}
	started := r.tasks.Go(func() {
		defer c.key.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		if err := r.recreateLocked(ctx, c); err != nil {
			r.log.Warn("create lost connection key", "user_id", c.userID, "conn_id", c.connID, "err", err)
		}
	})
	if !started {
		c.key.mu.Unlock() // shutting down: the connection is closed
	}
}

// active notes a sign of use at now (unix ns). The key carries it at the
// next refresh; when the reaper may act on the key before that (the
// connection is idle, or its away_at is near), the key and the record are
// written at once.
func (r *registrar) active(ctx context.Context, c *conn, now int64) error {
	c.lastActivity.Store(now)
	c.key.mu.Lock()
	defer c.key.mu.Unlock()
	soon := now/1e6 + (r.refreshInterval() + r.sweepInterval() + time.Second).Milliseconds()
	if !c.key.idle && c.key.awayAt > soon {
		return nil
	}
	c.key.idle = false
	if err := r.writeKeyLocked(ctx, c); err != nil {
		return err
	}
	_, _, err := r.addToRecord(ctx, c)
	return err
}

// setIdle marks the connection idle: the client says the person is not
// looking at it.
func (r *registrar) setIdle(ctx context.Context, c *conn) error {
	c.key.mu.Lock()
	defer c.key.mu.Unlock()
	if c.key.idle {
		return nil
	}
	c.key.idle = true
	if err := r.writeKeyLocked(ctx, c); err != nil {
		return err
	}
	_, _, err := r.addToRecord(ctx, c)
	return err
}

// setStatus writes the status the user of c chose.
func (r *registrar) setStatus(ctx context.Context, c *conn, st presence.Status) error {
	_, _, _, err := r.store.UpdateStatus(ctx, c.userID, func(rec *presence.Record) error {
		if rec.ChosenStatus() == st {
			return presence.ErrNoChange
		}
		rec.Chosen = st
		return nil
	})
	r.metrics.kvWrites.WithLabelValues("status").Inc()
	if err != nil {
		r.metrics.kvErrors.WithLabelValues("status").Inc()
	}
	return err
}

// settle decides, in the background, the key of a connection that ended:
// a clean close lets it live out the offline grace, marked closing;
// anything else removes it at once. The reaper then takes the connection
// out of the record.
func (r *registrar) settle(c *conn, kind endKind) {
	settle := func() { r.settleNow(c, kind) }
	if !r.tasks.Go(settle) {
		settle()
	}
}

func (r *registrar) settleNow(c *conn, kind endKind) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	c.key.mu.Lock()
	defer c.key.mu.Unlock()
	if kind == endClean && r.cfg.OfflineGrace > 0 {
		closedAt := time.Now().UnixMilli()
		rec := r.record(c)
		rec.Closing, rec.AwayAt = true, 0
		rev, err := r.store.WriteConn(ctx, c.userID, c.connID, rec, r.cfg.OfflineGrace, c.key.rev)
		r.metrics.kvWrites.WithLabelValues("closing").Inc()
		switch {
		case presence.IsWrongLastSequence(err):
			return // the key is already gone; its removal is on the way
		case err == nil:
			c.key.rev = rev
			_, _, _, err = r.store.UpdateStatus(ctx, c.userID, func(rec *presence.Record) error {
				ci, ok := rec.Conns[c.connID]
				if !ok || ci.Closing {
					return presence.ErrNoChange
				}
				ci.Closing, ci.ClosedAt = true, closedAt
				rec.Conns[c.connID] = ci
				return nil
			})
			r.metrics.kvWrites.WithLabelValues("status").Inc()
			if err == nil {
				return
			}
		}
		r.metrics.kvErrors.WithLabelValues("closing").Inc()
		r.log.Warn("mark connection closing", "user_id", c.userID, "conn_id", c.connID, "err", err)
		return
	}
	err := r.store.PurgeConn(ctx, c.userID, c.connID)
	r.metrics.kvWrites.WithLabelValues("purge").Inc()
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		r.metrics.kvErrors.WithLabelValues("purge").Inc()
		r.log.Warn("remove connection key", "user_id", c.userID, "conn_id", c.connID, "err", err)
	}
}

// sweep checks every connection of reg each sweep interval, until ctx is
// canceled: it ends, with end, connections silent for the TTL and those
// whose token expired, and refreshes the keys of connections heard from
// since their last write.
func (r *registrar) sweep(ctx context.Context, reg *registry, end func(*conn, endKind, ws.StatusCode, string)) {
	t := time.NewTicker(r.sweepInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.sweepOnce(reg, now.UnixNano(), end)
		}
	}
}

func (r *registrar) sweepOnce(reg *registry, now int64, end func(*conn, endKind, ws.StatusCode, string)) {
	ttl := int64(r.cfg.ConnTTL)
	every := int64(r.refreshInterval())
	reg.each(func(c *conn) {
		if c.closed.Load() {
			return
		}
		last := c.lastFrame.Load()
		if now-last > ttl {
			end(c, endDead, 0, "no frame for the connection TTL")
			return
		}
		if exp := c.expires.Load(); exp != 0 && now >= exp {
			end(c, endClean, ws.StatusPolicyViolation, "token expired")
			return
		}
		if w := c.key.writtenAt.Load(); last > w && now-w >= every {
			r.refresh(c, now)
		}
	})
}
