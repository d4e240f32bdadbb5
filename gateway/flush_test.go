package gateway_test

import (
	"errors"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// TestQuietSocketIsNotHeldForAnInterval checks the flusher's two rules
// with a long batch interval: a change to a socket that was not written to
// for an interval goes out at once, not at the end of an interval; and a
// socket just written to gets its next batch an interval later, its
// changes coalesced.
func TestQuietSocketIsNotHeldForAnInterval(t *testing.T) {
	t.Parallel()
	const interval = 4 * time.Second
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{BatchInterval: interval, ConnTTL: 30 * time.Second}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	bob := sys.Dial(gw, "bob")
	defer systest.KeepAlive(bob, time.Second)()
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, time.Second)()
	init, _ := subscribe(t, alice, "s", "bob")
	if len(init.Users) != 1 || init.Users[0].Status != presence.Online {
		t.Fatalf("presence_init %+v, want bob online", init.Users)
	}
	v := systest.NewView(t, alice)
	// Let a whole interval pass since the flusher last wrote to alice
	// (her self frame): what is measured is a rule about time.
	quiet := time.Now()
	natstest.CheckFor(t, 2*interval, 50*time.Millisecond, func() error {
		if time.Since(quiet) <= interval {
			return errors.New("an interval has not passed yet")
		}
		return nil
	})

	start := time.Now()
	if err := bob.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	v.Await("bob", presence.Busy)
	if d := time.Since(start); d >= interval/2 {
		t.Errorf("a change to a quiet socket took %v, want well under the %v interval", d, interval)
	}
	first := time.Now()
	// Two more changes right away: they wait for the rest of the
	// interval and arrive together, as the newest.
	if err := bob.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	if err := bob.SetStatus("online"); err != nil {
		t.Fatal(err)
	}
	before := len(v.Frames)
	v.Until(3*interval, "bob online again", func(v *systest.View) bool {
		p, _ := v.Presence("bob")
		return p.Status == presence.Online
	})
	if d := time.Since(first); d < interval*3/4 {
		t.Errorf("the next batch came %v after the previous one, want about the %v interval", d, interval)
	}
	batches := 0
	for _, m := range v.Frames[before:] {
		if m.Type == protocol.TypePresenceBatch {
			batches++
		}
	}
	if batches != 1 {
		t.Errorf("%d batches for two changes within an interval, want 1", batches)
	}
}
