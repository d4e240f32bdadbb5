package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// TestIdleKeyUnderALostLease: a connection that turns idle while the
// lease it is held under is lost leaves its key there alone (a reaper may
// have removed it, and a write would make it again, for nobody to
// remove); registered again under the new lease, its key there says it is
// idle, and later changes are written to it.
func TestIdleKeyUnderALostLease(t *testing.T) {
	r, store := leaseTestRegistrar(t)
	c := registerTestConn(t, r, "alice")
	old, _ := r.lease.epoch()
	oldKey := presence.LeaseConn{Gateway: r.cfg.ID, Epoch: old, UserID: "alice", ConnID: c.connID}

	// The lease is found gone, and a reaper removes its keys.
	r.lease.lose(old)
	if err := store.RemoveLeaseConns(context.Background(), r.cfg.ID, old); err != nil {
		t.Fatal(err)
	}
	if !r.setIdle(c, true) {
		t.Fatal("alice's connection did not turn idle")
	}
	flushKeyWrites(t, r)
	if rec, _, err := store.LeaseConnRecord(context.Background(), oldKey); !errors.Is(err, presence.ErrNotFound) {
		t.Errorf("alice's key under the lost lease: %+v, %v; want it gone", rec, err)
	}

	r.reregister(context.Background())
	epoch, _ := r.lease.epoch()
	newKey := presence.LeaseConn{Gateway: r.cfg.ID, Epoch: epoch, UserID: "alice", ConnID: c.connID}
	if rec, _, err := store.LeaseConnRecord(context.Background(), newKey); err != nil || !rec.Idle {
		t.Errorf("alice's key under the new lease: %+v, %v; want idle", rec, err)
	}
	r.setIdle(c, false)
	flushKeyWrites(t, r)
	if rec, _, err := store.LeaseConnRecord(context.Background(), newKey); err != nil || rec.Idle {
		t.Errorf("alice's key under the new lease once active: %+v, %v; want active", rec, err)
	}
}

// TestKeyOfAConnectionEndedWhileRegisteredAgain: a connection that ends
// while its key is created under a new lease leaves no key there. Its end
// removes the key it was held under; nothing else knows of the new one.
func TestKeyOfAConnectionEndedWhileRegisteredAgain(t *testing.T) {
	r, store := leaseTestRegistrar(t)
	c := registerTestConn(t, r, "alice")
	old, _ := r.lease.epoch()
	r.lease.lose(old)
	epoch, err := r.lease.take(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// It ends after reregisterConn looked at it and before the key is
	// created, as a socket closing during the create does: the socket's
	// closed flag is not set, so the create goes ahead.
	r.end(c, c.since)
	r.reregisterConn(context.Background(), c, epoch)
	key := presence.LeaseConn{Gateway: r.cfg.ID, Epoch: epoch, UserID: "alice", ConnID: c.connID}
	if rec, _, err := store.LeaseConnRecord(context.Background(), key); !errors.Is(err, presence.ErrNotFound) {
		t.Errorf("the ended connection's key under the new lease: %+v, %v; want it gone", rec, err)
	}
}

// leaseTestRegistrar returns a registrar holding a lease on a NATS server
// of its own, stopped when the test ends.
func leaseTestRegistrar(t *testing.T) (*registrar, *presence.Store) {
	t.Helper()
	nc := natstest.Connect(t, natstest.RunServer(t))
	s, err := New(nc, Config{DevAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	store, err := presence.Open(ctx, nc, s.cfg.Buckets)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRegistrar(nc, store, s.cfg, "127.0.0.1:0", s.metrics, s.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.stop(ctx)
	})
	return r, store
}

// registerTestConn registers a connection of user with r.
func registerTestConn(t *testing.T, r *registrar, user string) *conn {
	t.Helper()
	c := &conn{connID: "c-" + user, userID: user, device: "web", since: time.Now().UnixMilli()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := r.register(ctx, c); err != nil {
		t.Fatal(err)
	}
	return c
}

// flushKeyWrites waits for r's asynchronous key writes to be
// acknowledged.
func flushKeyWrites(t *testing.T, r *registrar) {
	t.Helper()
	select {
	case <-r.asyncJS.PublishAsyncComplete():
	case <-time.After(5 * time.Second):
		t.Fatal("key writes not acknowledged")
	}
}
