package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// TestRevokeDropsQueuedChange: a change of bob that waits in alice's
// outbox when bob stops following her is never written after the denied
// frame that ends her subscription (protocol.md: the gateway sends denied
// "and stops sending that target's changes"), whether it waits for her
// batch interval or behind a subscribe being answered.
func TestRevokeDropsQueuedChange(t *testing.T) {
	t.Parallel()
	t.Run("batch interval", func(t *testing.T) {
		// alice's self frame, right after hello, was her last write: bob's
		// change waits until the interval has passed.
		sys := systest.Start(t, systest.Options{Gateway: gateway.Config{BatchInterval: 3 * time.Second}})
		gw := sys.Gateway()
		sys.Mutual("alice", "bob", "carol")
		alice, bob, carol := revokeDial(t, sys, gw)
		subscribe(t, alice, "s", "bob", "carol")
		revokeQueued(t, sys, gw, alice, bob, carol)
	})
	t.Run("held by a subscribe", func(t *testing.T) {
		sys := systest.Start(t, systest.Options{})
		gw := sys.Gateway()
		sys.Mutual("alice", "bob", "carol")
		alice, bob, carol := revokeDial(t, sys, gw)
		subscribe(t, alice, "s1", "bob")
		// alice's next subscribe waits between its decision and its
		// registration, her outbox held until it is answered.
		held, releaseOnce := holdDecision(t, gw)
		if err := alice.Subscribe("s2", "carol"); err != nil {
			t.Fatal(err)
		}
		awaitClosed(t, held, "alice's subscribe to be decided")
		revokeQueued(t, sys, gw, alice, bob, nil)
		releaseOnce()
		systest.Await(t, alice, systest.EventTimeout, "presence_init s2", func(m protocol.ServerMessage) bool {
			revokeNoBob(t, m)
			return m.Type == protocol.TypePresenceInit && m.ID == "s2"
		})
		// carol's change, made after the subscribe was answered, is
		// written after whatever its release let out.
		awaitWithoutBob(t, alice, carol)
	})
}

// revokeDial connects alice, bob and carol to gw, kept alive.
func revokeDial(t *testing.T, sys *systest.System, gw *systest.Gateway) (alice, bob, carol *client.Conn) {
	t.Helper()
	conns := make([]*client.Conn, 3)
	for i, u := range []string{"bob", "carol", "alice"} {
		conns[i] = sys.Dial(gw, u)
		t.Cleanup(systest.KeepAlive(conns[i], systest.Heartbeat))
	}
	return conns[2], conns[0], conns[1]
}

// revokeQueued has a change of bob wait in alice's outbox, then bob
// unfollow alice, and waits for alice's denied. When carol is given, it
// then checks that nothing of bob comes before carol's next change.
func revokeQueued(t *testing.T, sys *systest.System, gw *systest.Gateway, alice, bob, carol *client.Conn) {
	t.Helper()
	bobBusyWaits(t, gw, alice, bob)
	if err := sys.Store.Unfollow(context.Background(), "bob", "alice"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, alice, systest.EventTimeout, "denied bob", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeDenied && m.UserID == "bob"
	})
	if carol != nil {
		awaitWithoutBob(t, alice, carol)
	}
}

// bobBusyWaits has bob set busy, and waits until his change waits in
// alice's outbox (her writes held, or paced).
func bobBusyWaits(t *testing.T, gw *systest.Gateway, alice, bob *client.Conn) {
	t.Helper()
	if err := bob.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, systest.EventTimeout, 5*time.Millisecond, func() error {
		if n, _ := gw.PendingUpdates("alice", alice.Hello.ConnID); n == 0 {
			return errors.New("bob's change does not wait in alice's outbox")
		}
		return nil
	})
}

// bobBusyWaitsHeld starts a system where alice, bob and carol follow each
// other, alice watching bob and carol, and bob's busy waits in alice's
// outbox while her socket's writes are held; releaseWrites lets them go.
func bobBusyWaitsHeld(t *testing.T) (sys *systest.System, gw *systest.Gateway, alice, bob, carol *client.Conn, releaseWrites func()) {
	t.Helper()
	sys = systest.Start(t, systest.Options{})
	gw = sys.Gateway()
	sys.Mutual("alice", "bob", "carol")
	alice, bob, carol = revokeDial(t, sys, gw)
	subscribe(t, alice, "s1", "bob", "carol")
	releaseWrites = gw.HoldWrites("alice", alice.Hello.ConnID)
	t.Cleanup(releaseWrites)
	bobBusyWaits(t, gw, alice, bob)
	return sys, gw, alice, bob, carol, releaseWrites
}

// awaitBobStays has carol set busy and reads alice's frames until that
// change, failing the test if one shows bob other than as want: a change
// of bob still waiting would be written no later than carol's.
func awaitBobStays(t *testing.T, alice, carol *client.Conn, want presence.Status) {
	t.Helper()
	if err := carol.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, alice, systest.EventTimeout, "carol busy", func(m protocol.ServerMessage) bool {
		if p, ok := presenceOf(m, "bob"); ok && p.Status != want {
			t.Fatalf("after bob %s, alice got %s with bob %s", want, m.Type, p.Status)
		}
		p, ok := presenceOf(m, "carol")
		return ok && p.Status == presence.Busy
	})
}

// awaitWithoutBob has carol change her status and reads alice's frames
// until that change, failing the test if one carries bob: a change of bob
// still waiting would be written no later than carol's.
func awaitWithoutBob(t *testing.T, alice, carol *client.Conn) {
	t.Helper()
	if err := carol.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, alice, systest.EventTimeout, "carol away", func(m protocol.ServerMessage) bool {
		revokeNoBob(t, m)
		p, ok := presenceOf(m, "carol")
		return ok && p.Status == presence.Away
	})
}

// revokeNoBob fails the test if m carries a change of bob.
func revokeNoBob(t *testing.T, m protocol.ServerMessage) {
	t.Helper()
	if p, ok := presenceOf(m, "bob"); ok {
		t.Fatalf("alice got %s with bob after her subscription ended: %+v", m.Type, p)
	}
}

// TestUnsubscribeDropsQueuedChange: a change of bob that waits in alice's
// outbox when she unsubscribes from bob is not written to her afterwards
// (protocol.md: unsubscribe stops watching them).
func TestUnsubscribeDropsQueuedChange(t *testing.T) {
	t.Parallel()
	_, gw, alice, _, carol, releaseWrites := bobBusyWaitsHeld(t)
	if err := alice.Send(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, ID: "u", UserIDs: []string{"bob"}}); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, systest.EventTimeout, 5*time.Millisecond, func() error {
		if w := gw.WatchedBy("alice", alice.Hello.ConnID); slices.Contains(w, "bob") {
			return fmt.Errorf("alice still watches %v", w)
		}
		return nil
	})
	releaseWrites()
	awaitWithoutBob(t, alice, carol)
}
