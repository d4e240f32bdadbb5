package client_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// refusal reports whether ev is the gateway refusing a request of the
// client (rate_limited, with the request's id).
func refusal(ev client.Event) bool {
	e, ok := ev.(client.ServerError)
	return ok && e.Code == protocol.CodeRateLimited && e.ID != ""
}

// TestJoinsWaitTheirTurnWithSubscribes subscribes to more users than the
// gateway takes requests at once, then joins rooms at once: the joins
// wait their turn with the subscribes, and every user is answered and
// every room joined, none refused.
func TestJoinsWaitTheirTurnWithSubscribes(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone, MaxSubscriptions: 1000}})
	alice := connect(t, sys.Gateway(), "alice", fast)
	ids := make([]string, 800)
	for i := range ids {
		ids[i] = fmt.Sprintf("user-%d", i)
	}
	if err := alice.c.Subscribe(ids...); err != nil {
		t.Fatal(err)
	}
	rooms := make([]string, gateway.DefaultMaxRoomsPerConn)
	for i := range rooms {
		rooms[i] = fmt.Sprintf("doc:%d", i)
		if err := alice.c.Join(rooms[i], nil); err != nil {
			t.Fatal(err)
		}
	}
	answered := make(map[string]bool)
	alice.await("every user answered and every room joined", func(ev client.Event) bool {
		switch ev := ev.(type) {
		case client.Snapshot:
			for _, p := range ev.Users {
				answered[p.UserID] = true
			}
		case client.ServerError, client.Denied, client.RoomDenied, client.Disconnected:
			t.Fatalf("refused: %+v", ev)
		}
		for _, id := range rooms {
			if r, _ := alice.c.Room(id); !r.Joined {
				return false
			}
		}
		return len(answered) == len(ids)
	})
	for _, id := range rooms {
		if err := alice.c.Typing(id); err != nil {
			t.Errorf("Typing in %s: %v", id, err)
		}
	}
}

// TestDeniedSubscribeAllFreesItsPlace: a subscribe to all that the policy
// refuses is answered only with denied "*"; that answer ends it, so more
// of them than wait at once do not stop the subscribes after them.
func TestDeniedSubscribeAllFreesItsPlace(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	sys.Mutual("alice", "bob")
	alice := connect(t, sys.Gateway(), "alice", fast)
	for range 12 {
		if err := alice.c.SubscribeAll(); err != nil {
			t.Fatal(err)
		}
		d := alice.await(`denied "*"`, isType[client.Denied]).(client.Denied)
		if d.UserID != "*" || d.Reason != protocol.ReasonNotAllowed || d.ID == "" {
			t.Fatalf("denied = %+v, want * not_allowed with the subscribe's id", d.Denied)
		}
	}
	if err := alice.c.Subscribe("bob"); err != nil {
		t.Fatal(err)
	}
	alice.await("the subscribe after the denied ones answered", func(ev client.Event) bool {
		s, ok := ev.(client.Snapshot)
		return ok && len(s.Users) == 1 && s.Users[0].UserID == "bob"
	})
	if w := alice.c.Watched(); !slices.Equal(w, []string{"bob"}) {
		t.Errorf("Watched() = %v, want [bob]", w)
	}
}

// TestRefusedRoomRequestsAreSentAgain holds a subscribe of alice at the
// app, which the gateway asks, and fills the gateway's queue behind it
// with her status changes: the leaves and joins she sends meanwhile are
// refused with rate_limited. The client sends them again once the queue
// moves, each room's in the order they were called, so the rooms end as
// the calls asked: one left, one left and joined again with a new meta,
// one joined.
func TestRefusedRoomRequestsAreSentAgain(t *testing.T) {
	t.Parallel()
	const subject = "app.authz"
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{
		Policy: gateway.PolicyApp, AppSubject: subject, AppTimeout: time.Minute,
	}})
	questions := make(chan *nats.Msg, 16)
	sub, err := sys.NC.Subscribe(subject, func(m *nats.Msg) { questions <- m })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	g := sys.Gateway()
	alice := connect(t, g, "alice", fast)
	bob := connect(t, g, "bob", fast)
	for _, e := range []*events{alice, bob} {
		for _, id := range []string{"doc:keep", "doc:gone"} {
			if err := e.c.Join(id, map[string]string{"name": capitalized(e.name)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, e := range []*events{alice, bob} {
		e.awaitRoom("doc:keep", "alice=Alice bob=Bob count=2 joined=true")
		e.awaitRoom("doc:gone", "alice=Alice bob=Bob count=2 joined=true")
	}

	// The app holds alice's subscribe: the gateway handles nothing of
	// hers after it until the app answers.
	if err := alice.c.Subscribe("carol"); err != nil {
		t.Fatal(err)
	}
	var question *nats.Msg
	for question == nil {
		select {
		case m := <-questions:
			var q struct{ Watcher string }
			if err := json.Unmarshal(m.Data, &q); err != nil {
				t.Fatalf("question %s: %v", m.Data, err)
			}
			if q.Watcher == "alice" {
				question = m
			} else if err := m.Respond([]byte(`{"allow": []}`)); err != nil {
				t.Fatal(err)
			}
		case <-time.After(waitFor):
			t.Fatal("the app was not asked about alice's subscribe")
		}
	}
	// Her status changes wait behind it, as many as the gateway takes.
	for i := range 16 {
		st := presence.Busy
		if i%2 == 1 {
			st = presence.Online
		}
		if err := alice.c.SetStatus(st); err != nil {
			t.Fatal(err)
		}
	}
	for _, call := range []func() error{
		func() error { return alice.c.Leave("doc:gone") },
		func() error { return alice.c.Leave("doc:keep") },
		func() error { return alice.c.Join("doc:keep", map[string]string{"name": "Alicia"}) },
		func() error { return alice.c.Join("doc:new", map[string]string{"name": "Alice"}) },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	refused := 0
	alice.await("the leaves and joins refused", func(ev client.Event) bool {
		if refusal(ev) {
			refused++
		}
		return refused >= 4
	})
	if err := question.Respond([]byte(`{"allow": ["carol"]}`)); err != nil {
		t.Fatal(err)
	}

	alice.awaitRoom("doc:new", "alice=Alice count=1 joined=true")
	alice.awaitRoom("doc:keep", "alice=Alicia bob=Bob count=2 joined=true")
	bob.awaitRoom("doc:keep", "alice=Alicia bob=Bob count=2 joined=true")
	bob.awaitRoom("doc:gone", "bob=Bob count=1 joined=true")
	if got := alice.c.Rooms(); !slices.Equal(got, []string{"doc:keep", "doc:new"}) {
		t.Errorf("alice's rooms: %v, want doc:keep and doc:new", got)
	}
	if err := alice.c.Typing("doc:new"); err != nil {
		t.Errorf("Typing in the room joined again: %v", err)
	}
}

// capitalized capitalises a user name: alice's meta says Alice.
func capitalized(user string) string {
	return string(user[0]-'a'+'A') + user[1:]
}

// aliceAndBobInARoom starts a system with a gateway of cfg, and has alice
// and bob join doc:1 there, named Alice and Bob.
func aliceAndBobInARoom(t *testing.T, cfg gateway.Config) (g *systest.Gateway, alice, bob *events) {
	t.Helper()
	sys := systest.Start(t, systest.Options{Gateway: cfg})
	g = sys.Gateway()
	alice = connect(t, g, "alice", fast)
	bob = connect(t, g, "bob", fast)
	for _, e := range []*events{alice, bob} {
		if err := e.c.Join("doc:1", map[string]string{"name": capitalized(e.name)}); err != nil {
			t.Fatal(err)
		}
	}
	bob.awaitRoom("doc:1", "alice=Alice bob=Bob count=2 joined=true")
	return g, alice, bob
}

// TestRefusedRoomUpdateIsSentAgain: the gateway refuses a room_update
// over its own rate with rate_limited; the client sends the newest meta
// again until it is taken, and the others see it.
func TestRefusedRoomUpdateIsSentAgain(t *testing.T) {
	t.Parallel()
	_, alice, bob := aliceAndBobInARoom(t, gateway.Config{RoomUpdateRate: 1, RoomUpdateBurst: 1})
	for _, name := range []string{"Alice B.", "Alice C."} {
		if err := alice.c.UpdateRoomMeta("doc:1", map[string]string{"name": name}); err != nil {
			t.Fatal(err)
		}
	}
	alice.await("the second update refused", refusal)
	bob.awaitRoom("doc:1", "alice=Alice C. bob=Bob count=2 joined=true")
	alice.awaitRoom("doc:1", "alice=Alice C. bob=Bob count=2 joined=true")
}

// TestRoomMetaBurstIsFolded: meta updates faster than the client's
// request rate (a cursor) are folded into the one that waits, so the
// gateway gets a few messages, not one per call, and the newest meta.
func TestRoomMetaBurstIsFolded(t *testing.T) {
	t.Parallel()
	g, alice, bob := aliceAndBobInARoom(t, gateway.Config{})
	before, _ := metricstest.Value(g.Registry(), "greendot_gateway_messages_received_total", "type", "room_update")
	const updates = 200
	for i := range updates {
		if err := alice.c.UpdateRoomMeta("doc:1", map[string]string{"name": fmt.Sprintf("Alice %d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	bob.awaitRoom("doc:1", fmt.Sprintf("alice=Alice %d bob=Bob count=2 joined=true", updates-1))
	after, _ := metricstest.Value(g.Registry(), "greendot_gateway_messages_received_total", "type", "room_update")
	if sent := after - before; sent >= updates/2 {
		t.Errorf("the gateway got %v room_update messages for %d updates, want them folded", sent, updates)
	}
}

// TestDroppedSubscribeIsSentAgain: the gateway's message rate limit drops
// a subscribe, with an error rate_limited that cannot say which message
// it dropped; the client sends the requests that were waiting again, and
// the subscribe is answered.
func TestDroppedSubscribeIsSentAgain(t *testing.T) {
	t.Parallel()
	// Slow heartbeats leave the socket's messages to the test.
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{
		RateLimit: 1, RateBurst: 5, RateStrikes: 1000,
		HeartbeatInterval: 10 * time.Second, ConnTTL: 30 * time.Second,
	}})
	sys.Mutual("alice", "bob")
	alice := connect(t, sys.Gateway(), "alice", fast)
	// As many messages as the limit takes at once, then the subscribe,
	// which it drops.
	for range 5 {
		if err := alice.c.Idle(); err != nil {
			t.Fatal(err)
		}
	}
	if err := alice.c.Subscribe("bob"); err != nil {
		t.Fatal(err)
	}
	alice.await("the subscribe dropped", func(ev client.Event) bool {
		e, ok := ev.(client.ServerError)
		return ok && e.Code == protocol.CodeRateLimited && e.ID == ""
	})
	alice.await("the subscribe answered", func(ev client.Event) bool {
		s, ok := ev.(client.Snapshot)
		return ok && len(s.Users) == 1 && s.Users[0].UserID == "bob"
	})
}

// TestRefusalDoesNotUndoALaterCall: a join refused because the socket is
// in as many rooms as it may be, and a subscribe refused because it
// watches as many users as it may, do not undo the same join or subscribe
// called again after a leave or unsubscribe made room: the client is in
// the room and watches the user, as the gateway has it.
func TestRefusalDoesNotUndoALaterCall(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{MaxRoomsPerConn: 1, MaxSubscriptions: 1}})
	sys.Mutual("alice", "bob", "carol")
	g := sys.Gateway()
	connect(t, g, "carol", fast)
	alice := connect(t, g, "alice", fast)
	if err := alice.c.Join("doc:a", nil); err != nil {
		t.Fatal(err)
	}
	if err := alice.c.Subscribe("bob"); err != nil {
		t.Fatal(err)
	}
	alice.awaitStatus("bob", presence.Offline)
	alice.awaitRoom("doc:a", "alice= count=1 joined=true")

	for _, call := range []func() error{
		func() error { return alice.c.Join("doc:b", nil) },
		func() error { return alice.c.Leave("doc:a") },
		func() error { return alice.c.Join("doc:b", nil) },
		func() error { return alice.c.Subscribe("carol") },
		func() error { return alice.c.Unsubscribe("bob") },
		func() error { return alice.c.Subscribe("carol") },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	alice.await("the join refused", func(ev client.Event) bool {
		d, ok := ev.(client.RoomDenied)
		return ok && d.Room == "doc:b" && d.Reason == protocol.ReasonTooManyRooms
	})
	alice.await("the subscribe refused", func(ev client.Event) bool {
		d, ok := ev.(client.Denied)
		return ok && d.UserID == "carol" && d.Reason == protocol.ReasonTooManySubscriptions
	})
	alice.awaitStatus("carol", presence.Online)
	if r, ok := alice.c.Room("doc:b"); !ok || !r.Joined || !slices.Equal(alice.c.Rooms(), []string{"doc:b"}) {
		t.Errorf("rooms %v, doc:b %+v, want doc:b joined", alice.c.Rooms(), r)
	}
	if w := alice.c.Watched(); !slices.Equal(w, []string{"carol"}) {
		t.Errorf("Watched() = %v, want [carol]", w)
	}
	if p, ok := alice.c.Presence("carol"); !ok || p.Status != presence.Online {
		t.Errorf("Presence(carol) = %+v, %v, want online", p, ok)
	}
}
