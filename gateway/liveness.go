package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/greendot/greendot/pkg/presence"
)

// A connection's life in presence_conns and presence_status:
//
//   - register creates its key (with a TTL), then adds it to the user's
//     status record by compare-and-set: the key always exists before the
//     record names it.
//   - while frames arrive, the sweeper refreshes the key's TTL, at most once
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

// keyTTL is the TTL of a live connection's key: the connection TTL plus a
// second, so that a refresh sent right at the end of a heartbeat interval
// still finds the key. The gateway itself ends a connection after ConnTTL
// without a frame.
func (s *Service) keyTTL() time.Duration { return s.cfg.ConnTTL + time.Second }

// inflight maps an asynchronous key write to its connection until the
// write is acknowledged or fails.
var inflight sync.Map // *nats.Msg -> *conn

// record returns the connection's key value as of now; the caller holds
// kvMu.
func (c *conn) record(now int64) presence.ConnRecord {
	rec := presence.ConnRecord{
		Gateway:  c.s.cfg.ID,
		Device:   c.device,
		Since:    c.since,
		ActiveAt: c.lastActivity.Load() / 1e6,
		Idle:     c.idle,
	}
	if !c.idle {
		rec.AwayAt = rec.ActiveAt + c.s.cfg.AwayAfter.Milliseconds()
	}
	return rec
}

// register creates the key and the record entry of a new connection for
// id, before its upgrade is answered. It returns the connection and the
// user's record after the change.
func (s *Service) register(ctx context.Context, id identity) (*conn, presence.Record, uint64, error) {
	now := time.Now()
	c := &conn{
		s:      s,
		connID: nuid.Next(),
		userID: id.userID,
		device: id.device,
		since:  now.UnixMilli(),
	}
	c.lastFrame.Store(now.UnixNano())
	c.lastActivity.Store(now.UnixNano())
	if !id.expires.IsZero() {
		c.expires.Store(id.expires.UnixNano())
	}
	c.kvMu.Lock()
	defer c.kvMu.Unlock()
	rec := c.record(now.UnixNano())
	start := time.Now()
	rev, err := s.store.CreateConn(ctx, c.userID, c.connID, rec, s.keyTTL())
	s.metrics.kvLatency.WithLabelValues("create_conn").Observe(time.Since(start).Seconds())
	s.metrics.kvWrites.WithLabelValues("create").Inc()
	if err != nil {
		s.metrics.kvErrors.WithLabelValues("create").Inc()
		return nil, presence.Record{}, 0, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	c.rev, c.awayAt = rev, rec.AwayAt
	c.writtenAt.Store(now.UnixNano())
	status, statusRev, err := s.addToRecord(ctx, c)
	if err != nil {
		_ = s.store.PurgeConn(context.WithoutCancel(ctx), c.userID, c.connID)
		return nil, presence.Record{}, 0, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return c, status, statusRev, nil
}

// addToRecord writes the connection into its user's record, as it is now;
// the caller holds kvMu. It always writes, so that a concurrent decision
// made from an older read fails.
func (s *Service) addToRecord(ctx context.Context, c *conn) (presence.Record, uint64, error) {
	start := time.Now()
	rec, rev, _, err := s.store.UpdateStatus(ctx, c.userID, func(r *presence.Record) error {
		r.SetConn(c.connID, presence.ConnInfo{
			Gateway: s.cfg.ID,
			Device:  c.device,
			Since:   c.since,
			Rev:     c.rev,
			Idle:    c.idle,
		})
		return nil
	})
	s.metrics.kvLatency.WithLabelValues("update_status").Observe(time.Since(start).Seconds())
	s.metrics.kvWrites.WithLabelValues("status").Inc()
	if err != nil {
		s.metrics.kvErrors.WithLabelValues("status").Inc()
	}
	return rec, rev, err
}

// writeKeyLocked writes the connection's key synchronously with a fresh
// TTL; the caller holds kvMu. A key that is gone is created again and put
// back in the record.
func (c *conn) writeKeyLocked(ctx context.Context, now int64) error {
	s := c.s
	rec := c.record(now)
	start := time.Now()
	rev, err := s.store.WriteConn(ctx, c.userID, c.connID, rec, s.keyTTL(), c.rev)
	s.metrics.kvLatency.WithLabelValues("write_conn").Observe(time.Since(start).Seconds())
	s.metrics.kvWrites.WithLabelValues("update").Inc()
	if presence.IsWrongLastSequence(err) {
		return c.recreateLocked(ctx)
	}
	if err != nil {
		s.metrics.kvErrors.WithLabelValues("update").Inc()
		return err
	}
	c.rev, c.awayAt = rev, rec.AwayAt
	c.writtenAt.Store(now)
	return nil
}

// recreateLocked creates the key of a live connection again after it was
// lost, and puts the connection back in the record; the caller holds kvMu.
//
// The key may not be lost at all: a write whose acknowledgement never came
// (a timeout while NATS was slow) may have been stored, so the key is there
// at a revision this gateway never learnt, and every write on the revision
// it knows fails. Then the key is written on the revision it has; left to
// fail, it would expire under a live connection.
func (c *conn) recreateLocked(ctx context.Context) error {
	s := c.s
	now := time.Now().UnixNano()
	rec := c.record(now)
	rev, err := s.store.CreateConn(ctx, c.userID, c.connID, rec, s.keyTTL())
	s.metrics.kvWrites.WithLabelValues("create").Inc()
	if presence.IsWrongLastSequence(err) || errors.Is(err, jetstream.ErrKeyExists) {
		var cur uint64
		if _, cur, err = s.store.Conn(ctx, c.userID, c.connID); err == nil {
			rev, err = s.store.WriteConn(ctx, c.userID, c.connID, rec, s.keyTTL(), cur)
			s.metrics.kvWrites.WithLabelValues("update").Inc()
		}
	}
	if err != nil {
		s.metrics.kvErrors.WithLabelValues("create").Inc()
		return err
	}
	c.rev, c.awayAt = rev, rec.AwayAt
	c.writtenAt.Store(now)
	if _, _, err := s.addToRecord(ctx, c); err != nil {
		return err
	}
	// One line per connection at debug: after a NATS outage every
	// connection may take this path. greendot_gateway_kv_writes_total
	// {kind="create"} counts them.
	if s.log.Enabled(ctx, levelDebug) {
		s.log.LogAttrs(ctx, levelDebug, "connection key was gone: created it again", attrUser(c.userID), attrConn(c.connID))
	}
	return nil
}

// refresh sends an asynchronous write of the key with a fresh TTL, unless
// another write of it is in flight. kvMu stays held until the write is
// acknowledged or fails (refreshAcked, refreshFailed).
func (c *conn) refresh(now int64) {
	if !c.kvMu.TryLock() {
		return
	}
	s := c.s
	if c.closed.Load() {
		c.kvMu.Unlock()
		return
	}
	rec := c.record(now)
	msg, err := presence.ConnMsg(c.userID, c.connID, &rec)
	if err != nil {
		c.kvMu.Unlock()
		return
	}
	c.flightAt, c.flightAway = now, rec.AwayAt
	inflight.Store(msg, c)
	c.flightSent = time.Now().UnixNano()
	if _, err := s.asyncJS.PublishMsgAsync(msg, presence.WriteConnOpts(s.keyTTL(), c.rev)...); err != nil {
		inflight.Delete(msg)
		c.kvMu.Unlock()
		s.metrics.kvErrors.WithLabelValues("refresh").Inc()
		return
	}
	s.metrics.kvWrites.WithLabelValues("refresh").Inc()
}

// refreshAcked takes the acknowledgement of an asynchronous key write. It
// runs on the NATS connection's reply goroutine and must not block.
func (s *Service) refreshAcked(_ jetstream.JetStream, msg *nats.Msg, ack *jetstream.PubAck) {
	v, ok := inflight.LoadAndDelete(msg)
	if !ok {
		return
	}
	c := v.(*conn)
	s.metrics.refreshLatency.Observe(float64(time.Now().UnixNano()-c.flightSent) / 1e9)
	c.rev, c.awayAt = ack.Sequence, c.flightAway
	c.writtenAt.Store(c.flightAt)
	c.kvMu.Unlock()
}

// refreshFailed takes the failure of an asynchronous key write. A key that
// is gone is created again, off the reply goroutine; other failures (a
// timeout, a lost NATS connection) leave the next sweep to try again.
func (s *Service) refreshFailed(_ jetstream.JetStream, msg *nats.Msg, err error) {
	v, ok := inflight.LoadAndDelete(msg)
	if !ok {
		return
	}
	c := v.(*conn)
	s.metrics.kvErrors.WithLabelValues("refresh").Inc()
	if !presence.IsWrongLastSequence(err) || c.closed.Load() {
		c.kvMu.Unlock()
		return
	}
	started := s.bg.Go(func() {
		defer c.kvMu.Unlock()
		ctx, cancel := context.WithTimeout(s.ctx, requestTimeout)
		defer cancel()
		if err := c.recreateLocked(ctx); err != nil {
			s.log.Warn("create lost connection key", "user_id", c.userID, "conn_id", c.connID, "err", err)
		}
	})
	if !started {
		c.kvMu.Unlock() // shutting down: the connection is closed
	}
}

// active notes a sign of use. The key carries it at the next refresh;
// when the reaper may act on the key before that (the connection is idle,
// or its away_at is near), the key and the record are written at once.
func (c *conn) active(ctx context.Context, now int64, id string) {
	c.lastActivity.Store(now)
	s := c.s
	c.kvMu.Lock()
	soon := now/1e6 + (s.cfg.refreshInterval() + s.cfg.sweepInterval() + time.Second).Milliseconds()
	if !c.idle && c.awayAt > soon {
		c.kvMu.Unlock()
		return
	}
	c.idle = false
	err := c.writeKeyLocked(ctx, now)
	if err == nil {
		_, _, err = s.addToRecord(ctx, c)
	}
	c.kvMu.Unlock()
	if err != nil {
		c.unavailable(id, err)
	}
}

// setIdle marks the connection idle: the client says the person is not
// looking at it.
func (c *conn) setIdle(ctx context.Context, id string) {
	s := c.s
	c.kvMu.Lock()
	if c.idle {
		c.kvMu.Unlock()
		return
	}
	c.idle = true
	err := c.writeKeyLocked(ctx, time.Now().UnixNano())
	if err == nil {
		_, _, err = s.addToRecord(ctx, c)
	}
	c.kvMu.Unlock()
	if err != nil {
		c.unavailable(id, err)
	}
}

// settle decides the key of a closed connection: a clean close lets it live
// out the offline grace, marked closing; anything else removes it at once.
// The reaper then takes the connection out of the record.
func (s *Service) settle(c *conn, kind endKind) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	c.kvMu.Lock()
	defer c.kvMu.Unlock()
	if kind == endClean && s.cfg.OfflineGrace > 0 {
		rec := c.record(time.Now().UnixNano())
		rec.Closing, rec.AwayAt = true, 0
		rev, err := s.store.WriteConn(ctx, c.userID, c.connID, rec, s.cfg.OfflineGrace, c.rev)
		s.metrics.kvWrites.WithLabelValues("closing").Inc()
		switch {
		case presence.IsWrongLastSequence(err):
			return // the key is already gone; its removal is on the way
		case err == nil:
			c.rev = rev
			_, _, _, err = s.store.UpdateStatus(ctx, c.userID, func(r *presence.Record) error {
				ci, ok := r.Conns[c.connID]
				if !ok || ci.Closing {
					return presence.ErrNoChange
				}
				ci.Closing = true
				r.Conns[c.connID] = ci
				return nil
			})
			s.metrics.kvWrites.WithLabelValues("status").Inc()
			if err == nil {
				return
			}
		}
		s.metrics.kvErrors.WithLabelValues("closing").Inc()
		s.log.Warn("mark connection closing", "user_id", c.userID, "conn_id", c.connID, "err", err)
		return
	}
	err := s.store.PurgeConn(ctx, c.userID, c.connID)
	s.metrics.kvWrites.WithLabelValues("purge").Inc()
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.metrics.kvErrors.WithLabelValues("purge").Inc()
		s.log.Warn("remove connection key", "user_id", c.userID, "conn_id", c.connID, "err", err)
	}
}

// sweep checks every connection each sweep interval, until ctx is
// canceled: it ends connections silent for the TTL and those whose token
// expired, and refreshes the keys of connections heard from since their
// last write.
func (s *Service) sweep(ctx context.Context) {
	t := time.NewTicker(s.cfg.sweepInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sweepOnce(now.UnixNano())
		}
	}
}

func (s *Service) sweepOnce(now int64) {
	ttl := int64(s.cfg.ConnTTL)
	every := int64(s.cfg.refreshInterval())
	s.registry.each(func(c *conn) {
		if c.closed.Load() {
			return
		}
		last := c.lastFrame.Load()
		if now-last > ttl {
			c.end(endDead, 0, "no frame for the connection TTL")
			return
		}
		if exp := c.expires.Load(); exp != 0 && now >= exp {
			c.end(endClean, 1008, "token expired")
			return
		}
		if w := c.writtenAt.Load(); last > w && now-w >= every {
			c.refresh(now)
		}
	})
}
