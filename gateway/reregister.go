package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/internal/sleep"
	"github.com/greendot/greendot/pkg/presence"
)

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
