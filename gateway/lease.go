package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/greendot/greendot/pkg/presence"
)

// lease is the gateway's lease in presence_leases: one key, refreshed about
// every second, whose end (expiry or deletion) ends every connection held
// under it. Each time the gateway takes a lease it makes a new epoch, and
// every connection it registers carries the epoch, in its key and in its
// user's record, so that the end of one lease can never end a connection
// registered under another.
//
// It is safe for concurrent use.
type lease struct {
	store *presence.Store
	log   *slog.Logger
	ttl   time.Duration
	every time.Duration

	mu       sync.Mutex
	rec      presence.LeaseRecord
	rev      uint64
	held     bool      // taken, and not known to be lost
	released bool      // given up: the gateway is stopping
	acked    time.Time // when the newest write of the key was acknowledged
	// changed is closed and replaced whenever held or acked change, to
	// wake those waiting for a fresh lease.
	changed chan struct{}
	// takeErr is the error of the last attempt of the take under way,
	// and takeFailed the number of its attempts that failed: nil and 0
	// while no take fails.
	takeErr    error
	takeFailed int
}

// takeLogEvery is the least time between two logs of a take's failed
// attempts: a long outage logs a line this often, with the number of
// attempts, rather than one per attempt.
const takeLogEvery = 10 * time.Second

// throttle lets the first of a run of events through, then at most one
// every period: a log line that a long outage would repeat.
type throttle struct {
	period time.Duration
	last   time.Time // of the last event let through; zero before
}

// allow reports whether the event at now goes through.
func (t *throttle) allow(now time.Time) bool {
	if !t.last.IsZero() && now.Sub(t.last) < t.period {
		return false
	}
	t.last = now
	return true
}

// errLeaseLost means the gateway's lease ended: its connections are being
// registered again under a new one.
var errLeaseLost = errors.New("the gateway's lease was lost; its connections are being registered again")

// errLeaseReleased means the gateway released its lease: it is stopping.
var errLeaseReleased = errors.New("the gateway's lease was released")

func newLease(store *presence.Store, log *slog.Logger, gatewayID, addr string, ttl time.Duration) *lease {
	return &lease{
		store:   store,
		log:     log,
		ttl:     ttl,
		every:   min(time.Second, ttl/4),
		rec:     presence.LeaseRecord{Gateway: gatewayID, Addr: addr},
		changed: make(chan struct{}),
	}
}

// take creates a lease with a new epoch, trying until it succeeds or ctx
// ends, and returns the epoch. A failed attempt is logged, the first at
// once and then at most one line every takeLogEvery, with the number of
// attempts; takeFailure says why meanwhile, for Ready.
func (l *lease) take(ctx context.Context) (string, error) {
	rec := l.record()
	rec.Epoch, rec.Started = nuid.Next(), time.Now().UnixMilli()
	key := presence.LeaseKey(rec.Gateway, rec.Epoch)
	defer l.tookOrGaveUp()
	backoff := 100 * time.Millisecond
	failed := 0
	logs := throttle{period: takeLogEvery}
	for {
		rev, err := l.store.CreateLease(ctx, rec, l.ttl)
		if err == nil {
			l.mu.Lock()
			l.rec, l.rev, l.held, l.acked = rec, rev, true, time.Now()
			l.wakeLocked()
			l.mu.Unlock()
			if failed > 0 {
				l.log.Info("took the gateway's lease after failed attempts", "lease", key, "attempts", failed+1)
			}
			return rec.Epoch, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		failed++
		l.mu.Lock()
		l.takeErr, l.takeFailed = err, failed
		l.mu.Unlock()
		if logs.allow(time.Now()) {
			l.log.Warn("take the gateway's lease: failed; trying again", "lease", key, "attempts", failed, "err", err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// tookOrGaveUp notes that no take is under way any more.
func (l *lease) tookOrGaveUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.takeErr, l.takeFailed = nil, 0
}

// takeFailure returns why the take under way has not succeeded yet: the
// error of its last attempt, with the number of attempts that failed; nil
// when no take is under way, or its attempts have not failed.
func (l *lease) takeFailure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.takeErr == nil {
		return nil
	}
	attempts := "attempts"
	if l.takeFailed == 1 {
		attempts = "attempt"
	}
	return fmt.Errorf("taking its lease: %w (%d %s failed)", l.takeErr, l.takeFailed, attempts)
}

func (l *lease) record() presence.LeaseRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec
}

// epoch returns the epoch of the lease, and whether it is held.
func (l *lease) epoch() (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec.Epoch, l.held
}

// holds reports whether the lease under epoch is held: taken, and not
// known to be lost.
func (l *lease) holds(epoch string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held && l.rec.Epoch == epoch
}

// fresh reports whether the lease is held and was confirmed recently
// enough to be sure it has not expired: within half its TTL.
func (l *lease) freshLocked(now time.Time) bool {
	return l.held && now.Sub(l.acked) < l.ttl/2
}

// waitFresh waits until the lease under epoch is fresh, and reports
// whether it is; false when that lease was lost (the epoch moved on) or
// ctx ended. Writes for connections held under a lease wait for it, so
// that none is written after the lease may have ended.
func (l *lease) waitFresh(ctx context.Context, epoch string) bool {
	for {
		l.mu.Lock()
		if l.rec.Epoch != epoch {
			l.mu.Unlock()
			return false
		}
		if l.freshLocked(time.Now()) {
			l.mu.Unlock()
			return true
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return false
		case <-ch:
		case <-time.After(l.every):
		}
	}
}

func (l *lease) wakeLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// refresh writes the lease again with a fresh TTL. It reports errLeaseLost
// when the lease is gone (expired, or deleted by an operator).
func (l *lease) refresh(ctx context.Context) error {
	l.mu.Lock()
	switch {
	case l.released:
		l.mu.Unlock()
		return errLeaseReleased
	case !l.held:
		l.mu.Unlock()
		return errLeaseLost
	}
	rec, rev := l.rec, l.rev
	l.mu.Unlock()
	msg, err := presence.LeaseMsg(&rec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, max(l.every, l.ttl/4))
	defer cancel()
	ack, err := l.store.JetStream().PublishMsg(ctx, msg, presence.RefreshOpts(l.ttl, rev)...)
	if presence.IsWrongLastSequence(err) {
		// Gone, or written by a refresh whose acknowledgement was lost.
		_, cur, rerr := l.store.Lease(ctx, rec.Gateway, rec.Epoch)
		switch {
		case errors.Is(rerr, presence.ErrNotFound):
			l.lose(rec.Epoch)
			return errLeaseLost
		case rerr != nil:
			return rerr
		}
		l.mu.Lock()
		if l.rec.Epoch == rec.Epoch {
			l.rev = cur
		}
		l.mu.Unlock()
		return nil
	}
	if err != nil {
		return fmt.Errorf("refresh lease %s: %w", presence.LeaseKey(rec.Gateway, rec.Epoch), err)
	}
	l.mu.Lock()
	if l.rec.Epoch == rec.Epoch && l.held {
		l.rev, l.acked = ack.Sequence, time.Now()
		l.wakeLocked()
	}
	l.mu.Unlock()
	return nil
}

// lose marks the lease under epoch lost.
func (l *lease) lose(epoch string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rec.Epoch == epoch && l.held {
		l.held = false
		l.wakeLocked()
	}
}

// release deletes the lease, when the gateway stops and its connections
// are gone: a reaper then removes whatever is left at once.
func (l *lease) release(ctx context.Context) error {
	rec, rev, held := l.giveUp()
	if !held {
		return nil
	}
	return l.store.DeleteLease(ctx, rec.Gateway, rec.Epoch, rev)
}

// handOver writes the lease a last time, with a TTL that ends at until,
// and gives it up: the gateway stops with connections still living out
// their offline grace, and the lease's end at until ends them (a reaper
// applies it). A TTL is whole seconds, at least one.
func (l *lease) handOver(ctx context.Context, until time.Time) error {
	rec, rev, held := l.giveUp()
	if !held {
		return nil
	}
	msg, err := presence.LeaseMsg(&rec)
	if err != nil {
		return err
	}
	_, err = l.store.JetStream().PublishMsg(ctx, msg, presence.RefreshOpts(time.Until(until), rev)...)
	return err
}

// giveUp marks the lease given up for good, and returns it as it was
// last written, and whether it was held.
func (l *lease) giveUp() (presence.LeaseRecord, uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec, rev, held := l.rec, l.rev, l.held
	l.held, l.released = false, true
	l.wakeLocked()
	return rec, rev, held
}

// age returns how long ago the lease was last confirmed; zero when it is
// not held.
func (l *lease) age() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		return 0
	}
	return time.Since(l.acked)
}
