package gateway_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// TestRevokedWhileSubscribing: a subscription revoked while its subscribe
// is being answered is not in the presence_init that follows its denied
// (protocol.md: after denied, none of the target's state is sent).
func TestRevokedWhileSubscribing(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	alice := sys.Dial(gw, "alice")
	t.Cleanup(systest.KeepAlive(alice, systest.Heartbeat))

	// Once alice's snapshot of bob is read, bob unfollows her, and her
	// subscribe waits until she has the denied.
	denied := make(chan struct{})
	gw.AfterSnapshot(t, "alice", sync.OnceFunc(func() {
		if err := sys.Store.Unfollow(context.Background(), "bob", "alice"); err != nil {
			t.Error(err)
		}
		select {
		case <-denied:
		case <-time.After(systest.EventTimeout):
			t.Error("alice was not denied bob while her subscribe waited")
		}
	}))
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, alice, systest.EventTimeout, "denied bob", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeDenied && m.UserID == "bob"
	})
	close(denied)
	m := systest.Await(t, alice, systest.EventTimeout, "presence_init s", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "s"
	})
	if p, ok := presenceOf(m, "bob"); ok {
		t.Errorf("presence_init after the denied of bob shows bob: %+v", p)
	}
}

// TestResubscribeDropsOlderQueuedChange: a change of bob that waits in
// alice's outbox when she subscribes to bob again is not written after the
// presence_init that answers it, which shows a newer state of bob
// (protocol.md: a change is never shown older than one already shown).
func TestResubscribeDropsOlderQueuedChange(t *testing.T) {
	t.Parallel()
	sys, gw, alice, bob, carol, releaseWrites := bobBusyWaitsHeld(t)
	// bob's away is written, its event held back until alice's subscribe
	// has read it.
	releaseEvents := gw.HoldDispatcher()
	t.Cleanup(releaseEvents)
	if err := bob.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, systest.EventTimeout, 5*time.Millisecond, func() error {
		if rec, err := sys.StatusOf("bob"); err != nil || rec.Public != presence.Away {
			return fmt.Errorf("bob's record: %+v, %v", rec, err)
		}
		return nil
	})
	gw.AfterSnapshot(t, "alice", sync.OnceFunc(func() {
		releaseEvents()
		releaseWrites()
	}))
	init, _ := subscribe(t, alice, "s2", "bob")
	if p, _ := presenceOf(init, "bob"); p.Status != presence.Away {
		t.Fatalf("presence_init s2 shows bob %+v, want away", p)
	}
	awaitBobStays(t, alice, carol, presence.Away)
}
