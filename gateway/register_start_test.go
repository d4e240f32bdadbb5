package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// TestLeaseLostWhileAConnectionStarts: a connection whose registration
// was written under the gateway's lease, and which is not yet in the
// gateway's registry when the gateway finds that lease gone, is
// registered again under the new lease like every other. Once the old
// lease's end is applied, its user is online with it, under the new
// epoch, and its key there exists; left under the old lease, it would be
// a live socket whose user shows offline for good.
func TestLeaseLostWhileAConnectionStarts(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	ctx := context.Background()
	_, old := leaseOf(t, sys, gw.ID())

	registered, release := gw.PauseAfterRegister(t, "alice")
	dialed := dialAsync(t, gw, "alice", "web")
	awaitClosed(t, registered, "alice's registration")

	// The lease goes (deleted, as an operator may) while alice's
	// connection is registered under it but not in the registry.
	natstest.CheckFor(t, systest.EventTimeout, 10*time.Millisecond, func() error {
		_, rev, err := sys.Store.Lease(ctx, old.Gateway, old.Epoch)
		if err != nil {
			return err
		}
		return sys.Store.DeleteLease(ctx, old.Gateway, old.Epoch, rev) // a refresh may come first
	})
	// The gateway takes a new lease, and is ready once it registered its
	// connections again under it.
	natstest.CheckFor(t, systest.EventTimeout, 10*time.Millisecond, func() error {
		if epoch, held := gw.LeaseEpoch(); epoch == old.Epoch || !held {
			return fmt.Errorf("still no new lease: %s (held %v)", epoch, held)
		}
		return gw.Ready(ctx)
	})
	epoch, _ := gw.LeaseEpoch()
	// The reaper applied the old lease's end: it removes the lease's keys
	// once its connections are out of their records.
	natstest.CheckFor(t, systest.EventTimeout, 10*time.Millisecond, func() error {
		keys, err := sys.Store.LeaseConns(ctx, old.Gateway, old.Epoch)
		if err == nil && len(keys) > 0 {
			err = fmt.Errorf("keys under the old lease: %v", keys)
		}
		return err
	})

	release()
	alice := awaitDialed(t, dialed)
	t.Cleanup(systest.KeepAlive(alice, systest.Heartbeat))
	id := alice.Hello.ConnID
	natstest.CheckFor(t, systest.EventTimeout, 10*time.Millisecond, func() error {
		rec, err := sys.StatusOf("alice")
		if err != nil {
			return err
		}
		if ci, ok := rec.Conns[id]; !ok || ci.Lease != epoch || rec.Status != presence.Online {
			return fmt.Errorf("alice's record says %s with %+v; want her connection %s under lease %s", rec.Status, rec.Conns, id, epoch)
		}
		return nil
	})
	key := presence.LeaseConn{Gateway: gw.ID(), Epoch: epoch, UserID: "alice", ConnID: id}
	if _, _, err := sys.Store.LeaseConnRecord(ctx, key); err != nil {
		t.Errorf("alice's key under the new lease: %v", err)
	}
}

// TestSelfChangeWhileADeviceStarts: a change of the user's own state
// written while another device of theirs is registered but not yet in
// the gateway's registry has its self event go through NATS, and the
// dispatcher may hand it out before that device is there. The device
// shows the change from its hello on, not the older state its
// registration wrote.
func TestSelfChangeWhileADeviceStarts(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	dialed, release := busyWhileBStarts(t, sys, gw, gw)
	// Device a has the change: its self event went by while b was not in
	// the registry.
	release()
	expectStartsBusy(t, dialed)
}

// busyWhileBStarts connects alice's device a to gwA, then has her device b
// connect to gwB and wait once registered, while a sets busy and sees it.
// Device b goes on when release is called.
func busyWhileBStarts(t *testing.T, sys *systest.System, gwA, gwB *systest.Gateway) (dialed *pendingDial, release func()) {
	t.Helper()
	a := sys.Dial(gwA, "alice", "a")
	t.Cleanup(systest.KeepAlive(a, systest.Heartbeat))
	systest.AwaitSelf(t, a, presence.Online, 1)
	registered, release := gwB.PauseAfterRegister(t, "alice")
	dialed = dialAsync(t, gwB, "alice", "b")
	awaitClosed(t, registered, "device b's registration")
	systest.AwaitSelf(t, a, presence.Online, 2) // b is in alice's record
	if err := a.SetStatus(string(presence.Busy)); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, a, presence.Busy, 2)
	return dialed, release
}

// expectStartsBusy checks that device b, once dialed, shows busy with two
// devices from its hello on.
func expectStartsBusy(t *testing.T, dialed *pendingDial) {
	t.Helper()
	b := awaitDialed(t, dialed)
	t.Cleanup(systest.KeepAlive(b, systest.Heartbeat))
	if b.Hello.Status != presence.Busy {
		t.Errorf("device b's hello says %s, want %s", b.Hello.Status, presence.Busy)
	}
	// Its own state comes right after hello.
	if m := systest.Next(t, b, systest.EventTimeout); m.Type != protocol.TypeSelf || m.Status != presence.Busy || m.Devices != 2 {
		t.Errorf("device b's first frame after hello: %+v; want self busy/2", m)
	}
}

// pendingDial is a connection dialAsync makes; c and err are set once
// done is closed.
type pendingDial struct {
	done chan struct{}
	c    *client.Conn
	err  error
}

// dialAsync connects user's device to gw in the background, for a test
// that holds the connection's start. A dial still under way when the
// test ends is given up; the connection is closed.
func dialAsync(t *testing.T, gw *systest.Gateway, user, device string) *pendingDial {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &pendingDial{done: make(chan struct{})}
	go func() {
		defer close(d.done)
		d.c, d.err = client.Dial(ctx, gw.WS+"?user="+user+"&device="+device, client.Options{})
	}()
	t.Cleanup(func() {
		cancel()
		<-d.done
		if d.c != nil {
			_ = d.c.Abort()
		}
	})
	return d
}

// awaitDialed returns the connection dialAsync made, failing the test if
// the dial fails or takes longer than systest.EventTimeout.
func awaitDialed(t *testing.T, d *pendingDial) *client.Conn {
	t.Helper()
	awaitClosed(t, d.done, "hello")
	if d.err != nil {
		t.Fatalf("dial: %v", d.err)
	}
	return d.c
}

// awaitClosed waits for ch to be closed, failing the test after
// systest.EventTimeout.
func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(systest.EventTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestSelfChangeOnAnotherGatewayWhileADeviceStarts: as
// TestSelfChangeWhileADeviceStarts, with the change written by the
// user's device on another gateway, whose self event reaches this one
// only through NATS.
func TestSelfChangeOnAnotherGatewayWhileADeviceStarts(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw, other := sys.Gateway(), sys.StartGateway(gateway.Config{})
	dialed, release := busyWhileBStarts(t, sys, other, gw)
	_, rev, err := sys.Store.Status(context.Background(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	// The self event of the change has reached b's gateway.
	natstest.CheckFor(t, systest.EventTimeout, 5*time.Millisecond, func() error {
		if got := gw.KnownSelf("alice"); got < rev {
			return fmt.Errorf("b's gateway knows alice's own state at revision %d, want %d", got, rev)
		}
		return nil
	})

	release()
	expectStartsBusy(t, dialed)
}
