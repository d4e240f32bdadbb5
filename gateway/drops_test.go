package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// aliceWatchesBobBuffered starts a system without fanout or reaper whose
// gateway's event dispatcher holds buffer events, with alice watching bob
// (online) and carol (offline), all mutual followers.
func aliceWatchesBobBuffered(t *testing.T, buffer int) (*systest.System, *systest.Gateway, *client.Conn) {
	t.Helper()
	sys := systest.Start(t, systest.Options{NoFanout: true, NoReaper: true,
		Gateway: gateway.WithEventsBuffer(gateway.Config{}, buffer)})
	sys.Mutual("alice", "bob", "carol")
	gw := sys.Gateway()
	alice, _ := dialKept(t, sys, gw, "alice"), dialKept(t, sys, gw, "bob")
	if err := alice.Subscribe("s", "bob", "carol"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Online)
	return sys, gw, alice
}

// TestEventsDroppedReadAgain: when the gateway falls so far behind that
// NATS drops a watched user's events (a slow consumer), the gateway reads
// that user's state again, and the watchers see the change the lost event
// carried. There is no fanout here to publish it again.
func TestEventsDroppedReadAgain(t *testing.T) {
	t.Parallel()
	const buffer = 16
	sys, gw, alice := aliceWatchesBobBuffered(t, buffer)

	release := gw.HoldDispatcher()
	defer release()
	// Events of carol (offline, as she is) fill the dispatcher's buffer,
	// and NATS drops the last of them...
	for i := range buffer + 10 {
		publishJSON(t, sys, presence.EventSubject("carol"), presence.Event{UserID: "carol", Status: presence.Offline, Rev: uint64(i + 1)})
	}
	// ...and the event of bob's next change, written meanwhile, is
	// dropped.
	rec, rev, _, err := sys.Store.UpdateStatus(context.Background(), "bob", func(r *presence.Record) error {
		r.Chosen = presence.Busy
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	publishJSON(t, sys, presence.EventSubject("bob"), presence.Event{UserID: "bob", Status: rec.Public, LastSeen: rec.LastSeen, Rev: rev, At: rec.Updated})
	// NATS tells of the drops once per subscription that falls behind:
	// carol's, then bob's.
	awaitDrops(t, gw, "event", 2)
	release()
	systest.AwaitStatus(t, alice, "bob", presence.Busy)
}

// TestEventsDroppedAfterTheReadReadAgain: NATS tells of the first event
// it drops of a subscription, not of those it drops after it until one
// gets through; a change whose event is dropped after the gateway read the
// user's state again is read again too, and the watchers see it.
func TestEventsDroppedAfterTheReadReadAgain(t *testing.T) {
	t.Parallel()
	const buffer = 16
	sys, gw, alice := aliceWatchesBobBuffered(t, buffer)

	// Events of carol (offline, as she is) fill the dispatcher's buffer,
	// and bob's are dropped.
	release := gw.HoldDispatcher()
	defer release()
	for i := range buffer {
		publishJSON(t, sys, presence.EventSubject("carol"), presence.Event{UserID: "carol", Status: presence.Offline, Rev: uint64(i + 1)})
	}
	setBob := func(status presence.Status) {
		t.Helper()
		rec, rev, _, err := sys.Store.UpdateStatus(context.Background(), "bob", func(r *presence.Record) error {
			r.Chosen = status
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		publishJSON(t, sys, presence.EventSubject("bob"), presence.Event{UserID: "bob", Status: rec.Public, LastSeen: rec.LastSeen, Rev: rev, At: rec.Updated})
	}
	reads := func() float64 {
		return metricValue(t, gw, "greendot_gateway_kv_seconds", map[string]string{"op": "get_status"})
	}
	before := reads()
	setBob(presence.Busy)
	awaitDrops(t, gw, "event", 1)
	// The gateway has read bob's state again (busy) when his next change
	// is written, and its event dropped as well.
	natstest.CheckFor(t, systest.EventTimeout, 5*time.Millisecond, func() error {
		if n := reads(); n <= before {
			return errors.New("bob's state not read again")
		}
		return nil
	})
	setBob(presence.Away)
	if err := sys.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	release()
	systest.AwaitStatus(t, alice, "bob", presence.Away)
}

// TestSelfReadAgainAfterReconnect: self events published while a gateway
// was cut off from NATS are lost to it; on getting its connection back it
// reads its users' records again, and their sockets are told their own
// state. (Here the change is written with no event and no fanout.)
func TestSelfReadAgainAfterReconnect(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{NoFanout: true, NoReaper: true})
	gw := sys.Gateway()
	alice := sys.Dial(gw, "alice", "web")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	systest.AwaitSelf(t, alice, presence.Online, 1)

	if _, _, _, err := sys.Store.UpdateStatus(context.Background(), "alice", func(r *presence.Record) error {
		r.Chosen = presence.Busy
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cutNATS(t, sys, gw)
	// The client reconnects within about a second; on a loaded machine
	// the read that follows may fail and be tried again.
	systest.Await(t, alice, 4*systest.EventTimeout, "self busy, found by reading again", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeSelf && m.Status == presence.Busy && m.Devices == 1
	})
}

// publishJSON publishes v, as JSON, on subject, as another process would.
func publishJSON(t *testing.T, sys *systest.System, subject string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.NC.Publish(subject, data); err != nil {
		t.Fatal(err)
	}
}

// awaitDrops waits until NATS has told gw of at least n drops of a kind.
func awaitDrops(t *testing.T, gw *systest.Gateway, kind string, n float64) {
	t.Helper()
	natstest.CheckFor(t, systest.EventTimeout, 10*time.Millisecond, func() error {
		if got := gw.NATSDrops(kind); got < n {
			return fmt.Errorf("%s drops: %v, want at least %v", kind, got, n)
		}
		return nil
	})
}

// cutNATS has the server close gw's NATS connection, which the gateway
// makes again within about a second.
func cutNATS(t *testing.T, sys *systest.System, gw *systest.Gateway) {
	t.Helper()
	id, err := gw.NATSClientID()
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.Server.DisconnectClientByID(id); err != nil {
		t.Fatal(err)
	}
}

// TestSelfHandedOver: the self event of a gateway's own write reaches the
// user's sockets there without going through NATS, and NATS carries it
// only to the other gateways holding the user's connections. There is no
// fanout here to publish what a writer did not.
func TestSelfHandedOver(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{NoFanout: true, NoReaper: true})
	gw1 := sys.Gateway()
	gw2 := sys.StartGateway(gateway.Config{})
	subs := map[*systest.Gateway]*nats.Subscription{}
	for _, gw := range []*systest.Gateway{gw1, gw2} {
		sub, err := sys.NC.SubscribeSync(presence.SelfSubject(gw.ID()))
		if err != nil {
			t.Fatal(err)
		}
		subs[gw] = sub
	}
	// carried returns how many self events NATS carried to gw so far, of
	// those the server has: it delivers what it has before it answers a
	// ping on this connection.
	carried := func(gw *systest.Gateway) int {
		t.Helper()
		if err := sys.NC.Flush(); err != nil {
			t.Fatal(err)
		}
		n, _, _ := subs[gw].Pending()
		return n
	}

	web := sys.Dial(gw1, "alice", "web")
	defer systest.KeepAlive(web, systest.Heartbeat)()
	systest.AwaitSelf(t, web, presence.Online, 1)
	phone := sys.Dial(gw1, "alice", "phone")
	defer systest.KeepAlive(phone, systest.Heartbeat)()
	systest.AwaitSelf(t, phone, presence.Online, 2)
	systest.AwaitSelf(t, web, presence.Online, 2)
	// Registering a connection is a write of gw1's too: its self event
	// reached web, and the phone, being registered, got its state from
	// its registration (or the newest gw1 wrote since), not from NATS.
	if n := carried(gw1); n != 0 {
		t.Errorf("%d self events to gw1 through NATS while her connections were registered, want none", n)
	}

	// Both of her connections are on gw1: with its dispatcher held, which
	// would hold a self event from NATS, both see her change.
	release := gw1.HoldDispatcher()
	defer release()
	if err := web.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, web, presence.Busy, 2)
	systest.AwaitSelf(t, phone, presence.Busy, 2)
	release()

	// With a device on gw2 too, gw2 hears of her next change from NATS,
	// gw1's sockets still from their writer. (gw2's write of the tablet's
	// connection went to gw1 through NATS: web saw it.)
	tablet := sys.Dial(gw2, "alice", "tablet")
	defer systest.KeepAlive(tablet, systest.Heartbeat)()
	systest.AwaitSelf(t, tablet, presence.Busy, 3)
	systest.AwaitSelf(t, web, presence.Busy, 3)
	before1, before2 := carried(gw1), carried(gw2)
	if err := phone.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*client.Conn{web, phone, tablet} {
		systest.AwaitSelf(t, c, presence.Away, 3)
	}
	if n := carried(gw2) - before2; n != 1 {
		t.Errorf("%d self events to gw2 through NATS, want 1", n)
	}
	if n := carried(gw1) - before1; n != 0 {
		t.Errorf("%d self events to gw1 through NATS, want none", n)
	}
}
