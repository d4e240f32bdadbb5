package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// TestEveryoneReadAgainAfterReconnect: under the everyone policy, a change
// a gateway missed (here a status record written with no event and no
// fanout to publish it) is found when the gateway reads every record again
// on getting its NATS connection back, and the sockets watching everyone
// are told.
func TestEveryoneReadAgainAfterReconnect(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{
		Gateway:  gateway.Config{Policy: gateway.PolicyEveryone},
		NoFanout: true,
		NoReaper: true, // carol's connection below has no lease behind it
	})
	gw := sys.Gateway()
	dave := sys.Dial(gw, "dave", "web")
	defer systest.KeepAlive(dave, systest.Heartbeat)()
	watchEveryone(t, dave)

	_, _, _, err := sys.Store.UpdateStatus(context.Background(), "carol", func(r *presence.Record) error {
		r.SetConn("elsewhere", presence.ConnInfo{Gateway: "gw-other", Lease: "E1", Since: time.Now().UnixMilli()})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cutNATS(t, sys, gw)
	// The client reconnects within about a second; on a loaded machine
	// the read that follows may fail and be tried again.
	systest.Await(t, dave, 4*systest.EventTimeout, "carol online, found by reading again", func(m protocol.ServerMessage) bool {
		if m.Type != protocol.TypePresenceBatch {
			return false
		}
		for _, p := range m.Updates {
			if p.UserID == "carol" && p.Status == presence.Online {
				return true
			}
		}
		return false
	})
}

// watchEveryone subscribes c to every user ("all": true) and returns the
// presence_init that answers it.
func watchEveryone(t *testing.T, c *client.Conn) protocol.ServerMessage {
	t.Helper()
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: "all", All: true}); err != nil {
		t.Fatal(err)
	}
	return systest.Await(t, c, systest.EventTimeout, "presence_init all", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "all"
	})
}

// holdOnlineRounds holds global presence's rounds that deliver a change
// of user: the first until release is called, the second until the test
// ends. held[i] is closed when the i-th round starts.
func holdOnlineRounds(t *testing.T, gw *systest.Gateway, user string) (held [2]chan struct{}, release func()) {
	held = [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	released := make(chan struct{})
	var mu sync.Mutex
	n := 0
	gw.BeforeOnlineRound(t, func(users []string) {
		if !slices.Contains(users, user) {
			return
		}
		mu.Lock()
		i := n
		n++
		mu.Unlock()
		switch i {
		case 0:
			close(held[0])
			<-released
		case 1:
			close(held[1])
			<-t.Context().Done()
		}
	})
	return held, sync.OnceFunc(func() { close(released) })
}

// TestEveryoneAndOneByOneInOrder: a socket that watches everyone, and bob
// and carol one by one too, never sees a change of bob after a newer one
// (protocol.md), however late global presence delivers it.
func TestEveryoneAndOneByOneInOrder(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.Gateway()
	bob, carol, alice := dialKept(t, sys, gw, "bob"), dialKept(t, sys, gw, "carol"), dialKept(t, sys, gw, "alice")
	watchEveryone(t, alice)
	subscribe(t, alice, "s", "bob", "carol")

	// Global presence's deliveries of bob's changes wait: the first until
	// alice has seen bob's next change, the second until the test ends.
	held, releaseOnce := holdOnlineRounds(t, gw, "bob")
	defer releaseOnce()
	if err := bob.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Busy)
	awaitClosed(t, held[0], "global presence to deliver bob's busy")
	if err := bob.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Away)
	releaseOnce()
	awaitClosed(t, held[1], "global presence to deliver bob's away")
	// bob's busy, if global presence delivered it, is written no later
	// than carol's change.
	awaitBobStays(t, alice, carol, presence.Away)
}

// TestEveryoneInitNotOvertaken: a change that global presence was about
// to deliver when a socket started watching everyone, older than what its
// presence_init shows, is not delivered to it.
func TestEveryoneInitNotOvertaken(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.Gateway()
	bob, carol := dialKept(t, sys, gw, "bob"), dialKept(t, sys, gw, "carol")
	dave, alice := dialKept(t, sys, gw, "dave"), dialKept(t, sys, gw, "alice")
	watchEveryone(t, dave)

	// Global presence's deliveries of bob's changes wait: the first until
	// alice watches everyone, the second until the test ends.
	held, releaseOnce := holdOnlineRounds(t, gw, "bob")
	defer releaseOnce()
	if err := bob.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, held[0], "global presence to deliver bob's busy")
	if err := bob.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, systest.EventTimeout, 5*time.Millisecond, func() error {
		var list onlineList
		if st := api(t, "GET", gw.HTTP+"/api/presence/online", "dave", nil, &list); st != http.StatusOK {
			return fmt.Errorf("GET online: %d", st)
		}
		if i := slices.IndexFunc(list.Users, func(p presence.Presence) bool { return p.UserID == "bob" }); i < 0 || list.Users[i].Status != presence.Away {
			return fmt.Errorf("global presence does not have bob away: %+v", list.Users)
		}
		return nil
	})
	init := watchEveryone(t, alice)
	if p, _ := presenceOf(init, "bob"); p.Status != presence.Away {
		t.Fatalf("presence_init shows bob %+v, want away", p)
	}
	// alice watches carol one by one too, so carol's changes reach her
	// while global presence waits.
	subscribe(t, alice, "s", "carol")
	releaseOnce()
	awaitClosed(t, held[1], "global presence to deliver bob's away")
	// bob's busy, if global presence delivered it to alice, is written no
	// later than carol's change.
	awaitBobStays(t, alice, carol, presence.Away)
}

// TestEveryoneLastSeenToMany: a change reaches more sockets watching
// everyone than the edges read one by one (the target's follows are read
// as one list then), each with last_seen as the target's settings let it
// see it: the target's contacts (users it follows) under the default
// setting, everyone under "everyone".
func TestEveryoneLastSeenToMany(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.Gateway()
	watchers := make([]*client.Conn, 20)
	contact := func(i int) bool { return i%2 == 0 }
	for i := range watchers {
		id := fmt.Sprintf("w%02d", i)
		if contact(i) {
			sys.Follow("target", id)
		} else {
			sys.Follow(id, "target") // the other way: not a contact
		}
		watchers[i] = dialKept(t, sys, gw, id)
		watchEveryone(t, watchers[i])
	}
	// awaitTarget waits for each watcher to be sent the target with
	// status, with last_seen or without as shown says.
	awaitTarget := func(step string, status presence.Status, shown func(i int) bool) {
		t.Helper()
		for i, c := range watchers {
			p := systest.AwaitStatus(t, c, "target", status)
			if (p.LastSeen != 0) != shown(i) {
				t.Errorf("%s: w%02d sees %+v, want last_seen shown %v", step, i, p, shown(i))
			}
		}
	}
	tc := dialKept(t, sys, gw, "target")
	awaitTarget("online", presence.Online, contact)
	if err := sys.Store.SetSettings(context.Background(), "target", presence.Settings{LastSeen: presence.Everyone}); err != nil {
		t.Fatal(err)
	}
	// The setting has the target shown again to every watcher, with
	// last_seen; a change after it carries last_seen too.
	for i, c := range watchers {
		systest.Await(t, c, systest.EventTimeout, fmt.Sprintf("w%02d shown the target's last_seen", i), func(m protocol.ServerMessage) bool {
			p, ok := presenceOf(m, "target")
			return m.Type == protocol.TypePresenceBatch && ok && p.Status == presence.Online && p.LastSeen != 0
		})
	}
	if err := tc.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	awaitTarget("busy, last_seen to everyone", presence.Busy, func(int) bool { return true })
}
