package client_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/system/systest"
)

// roomSays describes what c knows of a room: each user with the names in
// their connections' meta (each name once: a user's old connection may
// stay a while beside their new one), and whether it is joined on this
// connection.
func roomSays(c *client.Client, id string) string {
	r, ok := c.Room(id)
	if !ok {
		return "not in the room"
	}
	var users []string
	for _, m := range r.Members {
		var names []string
		for _, cn := range m.Conns {
			var meta struct{ Name string }
			_ = json.Unmarshal(cn.Meta, &meta)
			names = append(names, meta.Name)
		}
		slices.Sort(names)
		users = append(users, m.UserID+"="+strings.Join(slices.Compact(names), ","))
	}
	return fmt.Sprintf("%s count=%d joined=%v", strings.Join(users, " "), r.Count, r.Joined)
}

// hasConn reports whether c knows user's connection conn in the room.
func hasConn(c *client.Client, id, user, conn string) bool {
	r, _ := c.Room(id)
	for _, m := range r.Members {
		for _, cn := range m.Conns {
			if m.UserID == user && cn.ConnID == conn {
				return true
			}
		}
	}
	return false
}

// until reads events until cond holds; it may hold already.
func (e *events) until(what string, cond func() bool) {
	e.t.Helper()
	if cond() {
		return
	}
	e.await(what, func(client.Event) bool { return cond() })
}

// awaitRoom reads events until what the client knows of the room is want.
func (e *events) awaitRoom(id, want string) {
	e.t.Helper()
	e.until(fmt.Sprintf("room %s: %s", id, want), func() bool { return roomSays(e.c, id) == want })
}

// TestRooms: two clients in a room against a real gateway see each other
// join, change their meta and leave; after the gateway restarts, both are
// in the room again with their newest meta.
func TestRooms(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	g := sys.Gateway()
	alice := connect(t, g, "alice", fast)
	bob := connect(t, g, "bob", fast)

	for _, bad := range []struct {
		room string
		meta any
	}{
		{"doc/1", nil},
		{"", nil},
		{"lease_ended", nil},
		{strings.Repeat("x", 129), nil},
		{"doc:1", []int{1}},
		{"doc:1", "name"},
		{"doc:1", map[string]string{"name": strings.Repeat("x", client.MaxRoomMetaBytes)}},
		{"doc:1", func() {}},
	} {
		if err := alice.c.Join(bad.room, bad.meta); err == nil {
			t.Errorf("Join(%q, %v): no error", bad.room, bad.meta)
		}
	}
	if err := alice.c.UpdateRoomMeta("doc:1", map[string]string{"name": "x"}); err == nil || !strings.Contains(err.Error(), "not joined") {
		t.Errorf("UpdateRoomMeta of a room not joined: %v", err)
	}
	if got := alice.c.Rooms(); len(got) != 0 {
		t.Errorf("rooms after refused joins: %v", got)
	}

	if err := alice.c.Join("doc:1", map[string]string{"name": "Alice"}); err != nil {
		t.Fatal(err)
	}
	st := alice.await("room_state", isType[client.RoomState]).(client.RoomState)
	if st.Room != "doc:1" || st.ID == "" || st.Count != 1 {
		t.Errorf("alice's room_state: %+v", st.RoomState)
	}
	alice.awaitRoom("doc:1", "alice=Alice count=1 joined=true")

	if err := bob.c.Join("doc:1", map[string]string{"name": "Bob"}); err != nil {
		t.Fatal(err)
	}
	bob.awaitRoom("doc:1", "alice=Alice bob=Bob count=2 joined=true")
	alice.awaitRoom("doc:1", "alice=Alice bob=Bob count=2 joined=true")

	if err := bob.c.UpdateRoomMeta("doc:1", map[string]string{"name": "Bobby"}); err != nil {
		t.Fatal(err)
	}
	alice.awaitRoom("doc:1", "alice=Alice bob=Bobby count=2 joined=true")

	if err := bob.c.Leave("doc:1"); err != nil {
		t.Fatal(err)
	}
	if got := bob.c.Rooms(); len(got) != 0 {
		t.Errorf("bob's rooms after leaving: %v", got)
	}
	alice.awaitRoom("doc:1", "alice=Alice count=1 joined=true")
	if err := bob.c.Leave("doc:1"); err != nil {
		t.Errorf("leaving a room not joined: %v", err)
	}

	// bob comes back, and changes his meta again.
	if err := bob.c.Join("doc:1", map[string]string{"name": "Bob"}); err != nil {
		t.Fatal(err)
	}
	alice.awaitRoom("doc:1", "alice=Alice bob=Bob count=2 joined=true")
	if err := bob.c.UpdateRoomMeta("doc:1", map[string]string{"name": "Bob B."}); err != nil {
		t.Fatal(err)
	}
	alice.awaitRoom("doc:1", "alice=Alice bob=Bob B. count=2 joined=true")

	// Typing and signals reach the others, never the sender.
	if err := bob.c.Signal("doc:1", "Cursor", nil); err == nil {
		t.Error("Signal with a bad type: no error")
	}
	if err := bob.c.Signal("doc:1", "cursor", strings.Repeat("x", 300)); err == nil {
		t.Error("Signal with data over the limit: no error")
	}
	if err := bob.c.Typing("doc:9"); err == nil || errors.Is(err, client.ErrNotJoined) {
		t.Errorf("Typing in a room never joined: %v", err)
	}
	if err := bob.c.Typing("doc:1"); err != nil {
		t.Fatal(err)
	}
	if err := bob.c.Signal("doc:1", "cursor", map[string]int{"x": 7}); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	alice.until("bob's typing and cursor", func() bool {
		if len(alice.seen) > 0 {
			if ev, ok := alice.seen[len(alice.seen)-1].(client.RoomSignal); ok && ev.Room == "doc:1" {
				for _, s := range ev.Signals {
					if s.UserID == "bob" && s.ExpiresMS > 0 {
						got[s.Signal] = string(s.Data)
					}
				}
			}
		}
		return got["typing"] == "" && got["cursor"] == `{"x":7}` && len(got) == 2
	})
	bob.drain()
	for _, ev := range bob.seen {
		if ev, ok := ev.(client.RoomSignal); ok {
			t.Errorf("bob got signals back: %+v", ev.RoomSignal)
		}
	}

	// The gateway restarts: both reconnect and join again, bob with his
	// newest meta. (Their old connections leave once the old gateway's
	// lease is reaped.) Meanwhile there is no room to signal in.
	sys.StopGateway(g)
	alice.await("disconnected", isType[client.Disconnected])
	if err := alice.c.Typing("doc:1"); !errors.Is(err, client.ErrNotJoined) {
		t.Errorf("Typing while disconnected: %v, want ErrNotJoined", err)
	}
	sys.StartGatewayAt(gateway.Config{}, g.Addr)
	for _, e := range []*events{alice, bob} {
		e.await("reconnected", isType[client.Reconnected])
	}
	for _, e := range []*events{alice, bob} {
		for _, other := range []*events{alice, bob} {
			conn := other.c.Hello().ConnID
			e.until(fmt.Sprintf("%s's new connection %s in the room", other.name, conn), func() bool {
				return hasConn(e.c, "doc:1", other.name, conn)
			})
		}
		e.awaitRoom("doc:1", "alice=Alice bob=Bob B. count=2 joined=true")
	}
	if got := alice.c.Rooms(); !slices.Equal(got, []string{"doc:1"}) {
		t.Errorf("alice's rooms: %v", got)
	}
}
