package gateway_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// roomWatch is what a client knows of one room: room_state, then each
// room_diff applied over it.
type roomWatch struct {
	tb        testing.TB
	c         *client.Conn
	room      string
	members   map[string]map[string]string // user, connection, meta
	count     int
	truncated bool
}

// sendRoom sends a room message of type typ.
func sendRoom(tb testing.TB, c *client.Conn, typ, id, room, meta string) {
	tb.Helper()
	m := protocol.ClientMessage{Type: typ, ID: id, Room: room}
	if meta != "" {
		m.Meta = json.RawMessage(meta)
	}
	if err := c.Send(m); err != nil {
		tb.Fatal(err)
	}
}

// joinRoom joins c to room with meta, and returns what its room_state
// shows.
func joinRoom(tb testing.TB, c *client.Conn, id, room, meta string) *roomWatch {
	tb.Helper()
	sendRoom(tb, c, protocol.TypeJoin, id, room, meta)
	st := systest.Await(tb, c, systest.EventTimeout, "room_state "+id, func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeRoomState && m.ID == id
	})
	w := &roomWatch{tb: tb, c: c, room: room}
	w.take(st)
	return w
}

// take applies a room frame of the watched room.
func (w *roomWatch) take(m protocol.ServerMessage) {
	if m.Room != w.room {
		return
	}
	switch m.Type {
	case protocol.TypeRoomState:
		w.members, w.truncated = map[string]map[string]string{}, m.Truncated
		for _, mb := range m.Members {
			for _, rc := range mb.Conns {
				w.set(mb.UserID, rc.ConnID, string(rc.Meta))
			}
		}
	case protocol.TypeRoomDiff:
		for _, mb := range m.Leaves {
			for _, rc := range mb.Conns {
				delete(w.members[mb.UserID], rc.ConnID)
				if len(w.members[mb.UserID]) == 0 {
					delete(w.members, mb.UserID)
				}
			}
		}
		for _, mb := range m.Joins {
			for _, rc := range mb.Conns {
				w.set(mb.UserID, rc.ConnID, string(rc.Meta))
			}
		}
	default:
		return
	}
	w.count = m.Count
}

func (w *roomWatch) set(user, conn, meta string) {
	if w.members[user] == nil {
		w.members[user] = map[string]string{}
	}
	w.members[user][conn] = meta
}

// users returns the users the client sees in the room, sorted.
func (w *roomWatch) users() []string { return slices.Sorted(maps.Keys(w.members)) }

// until reads the client's frames, applying those of the room, until cond
// holds; it fails the test after systest.EventTimeout.
func (w *roomWatch) until(what string, cond func(*roomWatch) bool) {
	w.tb.Helper()
	w.untilWithin(systest.EventTimeout, what, cond)
}

func (w *roomWatch) untilWithin(timeout time.Duration, what string, cond func(*roomWatch) bool) {
	w.tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond(w) {
		left := time.Until(deadline)
		if left <= 0 {
			w.tb.Fatalf("room %s: waiting for %s; the client sees %v (count %d)", w.room, what, w.members, w.count)
		}
		w.take(systest.Next(w.tb, w.c, left))
	}
}

// dialKept connects user to g and keeps the socket alive until the test
// ends.
func dialKept(t *testing.T, sys *systest.System, g *systest.Gateway, user string) *client.Conn {
	t.Helper()
	c := sys.Dial(g, user)
	t.Cleanup(systest.KeepAlive(c, systest.Heartbeat))
	return c
}

// TestRoomJoinDiffsAndLeave: two gateways, one room. Each member sees the
// room's state when it joins (itself included), then the others' joins,
// meta changes, second devices and leaves, in room_diff frames.
func TestRoomJoinDiffsAndLeave(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw1 := sys.Gateway()
	gw2 := sys.StartGateway(gateway.Config{})

	alice := dialKept(t, sys, gw1, "alice")
	wa := joinRoom(t, alice, "j1", "doc:42", `{"name": "Alice"}`)
	if wa.count != 1 || wa.members["alice"][alice.Hello.ConnID] != `{"name":"Alice"}` || wa.truncated {
		t.Fatalf("alice's room_state: %v, count %d", wa.members, wa.count)
	}

	bob := dialKept(t, sys, gw2, "bob")
	wb := joinRoom(t, bob, "j2", "doc:42", "")
	if wb.count != 2 || !slices.Equal(wb.users(), []string{"alice", "bob"}) || wb.members["bob"][bob.Hello.ConnID] != "{}" {
		t.Fatalf("bob's room_state: %v, count %d", wb.members, wb.count)
	}
	wa.until("bob in the room", func(w *roomWatch) bool { return w.members["bob"][bob.Hello.ConnID] == "{}" && w.count == 2 })

	sendRoom(t, bob, protocol.TypeRoomUpdate, "", "doc:42", `{"cursor":7}`)
	wa.until("bob's new meta", func(w *roomWatch) bool { return w.members["bob"][bob.Hello.ConnID] == `{"cursor":7}` })

	// A second device of bob: one user, two connections.
	phone := dialKept(t, sys, gw1, "bob")
	joinRoom(t, phone, "j3", "doc:42", `{"device":"phone"}`)
	wa.until("bob's two connections", func(w *roomWatch) bool { return len(w.members["bob"]) == 2 && w.count == 2 })
	wb.until("bob's phone", func(w *roomWatch) bool { return len(w.members["bob"]) == 2 })

	sendRoom(t, phone, protocol.TypeLeave, "", "doc:42", "")
	wa.until("bob's phone gone", func(w *roomWatch) bool {
		_, web := w.members["bob"][bob.Hello.ConnID]
		return len(w.members["bob"]) == 1 && web && w.count == 2
	})
	sendRoom(t, bob, protocol.TypeLeave, "", "doc:42", "")
	wa.until("bob gone", func(w *roomWatch) bool { return slices.Equal(w.users(), []string{"alice"}) && w.count == 1 })

	// The keys say the same: only alice's is left.
	natsCheckRoom(t, sys, "doc:42", []string{alice.Hello.ConnID})
}

// natsCheckRoom waits until the keys of room in presence_rooms are those
// of conns.
func natsCheckRoom(t *testing.T, sys *systest.System, room string, conns []string) {
	t.Helper()
	want := slices.Sorted(slices.Values(conns))
	natstest.CheckFor(t, systest.EventTimeout, 50*time.Millisecond, func() error {
		entries, err := sys.Store.RoomMembers(t.Context(), room)
		if err != nil {
			return err
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Member.ConnID)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("keys of room %s: connections %v, want %v", room, got, want)
		}
		return nil
	})
}

// TestRoomCloseReloadAndSilentDeath: a clean close leaves the room only
// after the offline grace, so a reload within it keeps the user in the
// room throughout; a connection that goes silent leaves within the TTL
// plus about 2 s.
func TestRoomCloseReloadAndSilentDeath(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	alice := dialKept(t, sys, gw, "alice")
	wa := joinRoom(t, alice, "j1", "game:7:lobby", "")

	bob := sys.Dial(gw, "bob")
	stop := systest.KeepAlive(bob, systest.Heartbeat)
	joinRoom(t, bob, "j2", "game:7:lobby", "")
	wa.until("bob in", func(w *roomWatch) bool { return w.count == 2 })

	// A reload: the old socket closes, a new one joins within the grace.
	stop()
	closed := time.Now()
	if err := bob.Close(); err != nil {
		t.Fatal(err)
	}
	bob2 := dialKept(t, sys, gw, "bob")
	joinRoom(t, bob2, "j3", "game:7:lobby", "")
	wa.until("the old connection gone", func(w *roomWatch) bool {
		if w.count != 2 {
			t.Fatalf("bob left the room during a reload: count %d", w.count)
		}
		_, old := w.members["bob"][bob.Hello.ConnID]
		_, fresh := w.members["bob"][bob2.Hello.ConnID]
		return !old && fresh
	})
	if took := time.Since(closed); took < systest.Grace {
		t.Errorf("the closed connection left the room after %v, within the offline grace %v", took, systest.Grace)
	}

	// A silent death: no frame, no close.
	sys2 := bob2
	died := time.Now()
	if err := sys2.Abort(); err != nil {
		t.Fatal(err)
	}
	wa.untilWithin(systest.TTL+systest.Grace+5*time.Second, "bob gone", func(w *roomWatch) bool { return w.count == 1 })
	t.Logf("a dead connection left the room %v after its last frame", time.Since(died))
}

// TestRoomRefusals: every limit and bad input is answered as documented,
// and the socket stays open.
func TestRoomRefusals(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{
		MaxRoomsPerConn: 2, RoomMetaMax: 32, RoomUpdateRate: 0.01, RoomUpdateBurst: 2,
	}})
	c := dialKept(t, sys, sys.Gateway(), "alice")
	await := func(what, id string, typ string) protocol.ServerMessage {
		t.Helper()
		return systest.Await(t, c, systest.EventTimeout, what, func(m protocol.ServerMessage) bool {
			return m.Type == typ && m.ID == id
		})
	}
	for _, bad := range []string{"doc.42", "", strings.Repeat("r", 129), "lease_ended", "doc*"} {
		sendRoom(t, c, protocol.TypeJoin, "bad", bad, "")
		if m := await("room_denied of "+bad, "bad", protocol.TypeRoomDenied); m.Reason != protocol.ReasonInvalidRoom || m.Room != bad {
			t.Errorf("join %q: %+v", bad, m)
		}
	}
	sendRoom(t, c, protocol.TypeJoin, "big", "doc:1", `{"text":"`+strings.Repeat("x", 40)+`"}`)
	if m := await("meta too large", "big", protocol.TypeError); m.Code != protocol.CodeBadRequest || !strings.Contains(m.Message, "at most 32") {
		t.Errorf("meta too large: %+v", m)
	}
	for _, meta := range []string{`[1]`, `"x"`, `3`} {
		sendRoom(t, c, protocol.TypeJoin, "arr", "doc:1", meta)
		if m := await("meta not an object", "arr", protocol.TypeError); m.Code != protocol.CodeBadRequest || !strings.Contains(m.Message, `"meta"`) {
			t.Errorf("meta %s: %+v", meta, m)
		}
	}
	if err := c.SendRaw(1, []byte(`{"type":"join","id":"num","room":5}`)); err != nil {
		t.Fatal(err)
	}
	if m := await("room not a string", "num", protocol.TypeError); m.Code != protocol.CodeBadRequest || !strings.Contains(m.Message, `"room"`) {
		t.Errorf("room 5: %+v", m)
	}
	sendRoom(t, c, protocol.TypeRoomUpdate, "nj", "doc:1", `{}`)
	if m := await("update of a room not joined", "nj", protocol.TypeError); m.Code != protocol.CodeBadRequest || !strings.Contains(m.Message, "join it first") {
		t.Errorf("update not joined: %+v", m)
	}
	sendRoom(t, c, protocol.TypeLeave, "", "doc:9", "") // not joined: nothing

	joinRoom(t, c, "a", "doc:1", "")
	joinRoom(t, c, "b", "doc:2", "")
	sendRoom(t, c, protocol.TypeJoin, "c", "doc:3", "")
	if m := await("too many rooms", "c", protocol.TypeRoomDenied); m.Reason != protocol.ReasonTooManyRooms || m.Room != "doc:3" {
		t.Errorf("third room: %+v", m)
	}
	// Joining a room again is no new room: it changes the meta and shows
	// the state again.
	w := joinRoom(t, c, "again", "doc:2", `{"v":2}`)
	if w.members["alice"][c.Hello.ConnID] != `{"v":2}` {
		t.Errorf("joined again: %v", w.members)
	}

	// room_update beyond its rate: the burst of 2 passes, the third not.
	for i := range 3 {
		sendRoom(t, c, protocol.TypeRoomUpdate, fmt.Sprint("u", i), "doc:1", fmt.Sprintf(`{"v":%d}`, i))
	}
	if m := await("rate limited update", "u2", protocol.TypeError); m.Code != protocol.CodeRateLimited || !strings.Contains(m.Message, "--room-update-rate") {
		t.Errorf("third update: %+v", m)
	}
	// Leaving frees a room.
	sendRoom(t, c, protocol.TypeLeave, "", "doc:1", "")
	joinRoom(t, c, "d", "doc:3", "")
}

// TestRoomUpdateNeedsMeta: a room_update without meta, or with a null
// one, is answered with bad_request naming the field, and the member's
// meta stays as it was for everyone: a misspelt field wipes no avatar.
func TestRoomUpdateNeedsMeta(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	alice := dialKept(t, sys, sys.Gateway(), "alice")
	bob := dialKept(t, sys, sys.Gateway(), "bob")
	joinRoom(t, alice, "a", "doc:1", `{"avatar":"a"}`)
	wb := joinRoom(t, bob, "b", "doc:1", "")
	aliceMeta := func(w *roomWatch) string { return w.members["alice"][alice.Hello.ConnID] }
	wb.until("alice's avatar", func(w *roomWatch) bool { return aliceMeta(w) == `{"avatar":"a"}` })

	for _, tt := range []struct{ id, msg string }{
		{"missing", `{"type":"room_update","id":"missing","room":"doc:1","mta":{"avatar":"x"}}`},
		{"null", `{"type":"room_update","id":"null","room":"doc:1","meta":null}`},
		{"spaced null", `{"type":"room_update","id":"spaced null","room":"doc:1","meta": null }`},
	} {
		if err := alice.SendRaw(1, []byte(tt.msg)); err != nil {
			t.Fatal(err)
		}
		m := systest.Await(t, alice, systest.EventTimeout, "the error of "+tt.id, func(m protocol.ServerMessage) bool {
			return m.Type == protocol.TypeError && m.ID == tt.id
		})
		if m.Code != protocol.CodeBadRequest || !strings.Contains(m.Message, `"meta"`) {
			t.Errorf("room_update %s: %+v, want bad_request naming \"meta\"", tt.msg, m)
		}
	}
	// The next update is the first change bob sees of alice.
	sendRoom(t, alice, protocol.TypeRoomUpdate, "", "doc:1", `{"avatar":"b"}`)
	wb.until("alice's new avatar", func(w *roomWatch) bool {
		if got := aliceMeta(w); got != `{"avatar":"a"}` && got != `{"avatar":"b"}` {
			t.Fatalf("bob sees alice's meta %s", got)
		}
		return aliceMeta(w) == `{"avatar":"b"}`
	})
}

// TestRoomTruncated: a room with more users than a room_state lists is
// shown truncated, with the true count; the client then gets the diffs of
// the users it was shown, and the count as it moves.
func TestRoomTruncated(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{RoomMembersMax: 2}})
	gw := sys.Gateway()
	users := map[string]*client.Conn{}
	for _, u := range []string{"u1", "u2", "u3"} {
		users[u] = dialKept(t, sys, gw, u)
		joinRoom(t, users[u], "j", "chat:big", "")
	}
	dave := dialKept(t, sys, gw, "dave")
	w := joinRoom(t, dave, "j", "chat:big", "")
	if !w.truncated || w.count != 4 || !slices.Equal(w.users(), []string{"dave", "u1"}) {
		t.Fatalf("room_state: truncated %v, count %d, users %v; want truncated, 4, [dave u1]", w.truncated, w.count, w.users())
	}
	// A user not shown leaves: only the count moves.
	sendRoom(t, users["u3"], protocol.TypeLeave, "", "chat:big", "")
	w.until("the count of 3", func(w *roomWatch) bool { return w.count == 3 })
	if !slices.Equal(w.users(), []string{"dave", "u1"}) {
		t.Errorf("after a user not shown left: %v", w.users())
	}
	// A user shown changes: the diff says so.
	sendRoom(t, users["u1"], protocol.TypeRoomUpdate, "", "chat:big", `{"typing":false}`)
	w.until("u1's meta", func(w *roomWatch) bool { return w.members["u1"][users["u1"].Hello.ConnID] == `{"typing":false}` })
	// A new user, not shown: the count only.
	late := dialKept(t, sys, gw, "u9")
	// Not shown to itself either: its room_state lists the first users.
	if wl := joinRoom(t, late, "j", "chat:big", ""); !wl.truncated || !slices.Equal(wl.users(), []string{"dave", "u1"}) {
		t.Errorf("u9's room_state: truncated %v, users %v; want truncated, [dave u1]", wl.truncated, wl.users())
	}
	w.until("the count of 4", func(w *roomWatch) bool { return w.count == 4 })
	if _, shown := w.members["u9"]; shown {
		t.Errorf("a user not shown came in a diff: %v", w.members)
	}
}

// TestRoomInvisible: an invisible user's connections have no key in the
// room, so others do not see them, while they still get the room's state
// and diffs; visible again, they are back.
func TestRoomInvisible(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	alice := dialKept(t, sys, gw, "alice")
	wa := joinRoom(t, alice, "j", "doc:5", "")

	bob := dialKept(t, sys, gw, "bob")
	if err := bob.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, bob, presence.Invisible, 1)
	wb := joinRoom(t, bob, "j", "doc:5", "")
	if !slices.Equal(wb.users(), []string{"alice"}) || wb.count != 1 {
		t.Fatalf("invisible bob's room_state: %v, count %d; want alice only", wb.members, wb.count)
	}
	carol := dialKept(t, sys, gw, "carol")
	joinRoom(t, carol, "j", "doc:5", "")
	wb.until("carol, seen by invisible bob", func(w *roomWatch) bool { return len(w.members["carol"]) == 1 })
	wa.until("carol", func(w *roomWatch) bool { return w.count == 2 })
	if _, seen := wa.members["bob"]; seen {
		t.Fatalf("alice sees invisible bob: %v", wa.members)
	}
	natsCheckRoom(t, sys, "doc:5", []string{alice.Hello.ConnID, carol.Hello.ConnID})

	if err := bob.SetStatus("online"); err != nil {
		t.Fatal(err)
	}
	wa.until("bob, visible again", func(w *roomWatch) bool { return len(w.members["bob"]) == 1 && w.count == 3 })
	// And a user who turns invisible while in the room leaves it.
	if err := bob.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	wa.until("bob gone again", func(w *roomWatch) bool { _, in := w.members["bob"]; return !in && w.count == 2 })
}

// roomToken returns a token for sub whose rooms claim is rooms (none when
// nil).
func roomToken(tb testing.TB, sub string, rooms []string) string {
	tb.Helper()
	claims := jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()}
	if rooms != nil {
		claims["rooms"] = rooms
	}
	return secSign(tb, jwt.SigningMethodHS256, secSecret, claims)
}

// TestRoomTokenAuthorization: a token's rooms claim says which rooms its
// holder may join, by id or by prefix; a token without it allows none; an
// auth renewal replaces it, and the rooms it no longer allows are left
// with room_denied.
func TestRoomTokenAuthorization(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()

	none, err := secDialErr(gw.WS, bearer(roomToken(t, "bob", nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = none.Abort() })
	t.Cleanup(systest.KeepAlive(none, systest.Heartbeat))
	sendRoom(t, none, protocol.TypeJoin, "n", "doc:1", "")
	m := systest.Await(t, none, systest.EventTimeout, "room_denied", isType(protocol.TypeRoomDenied))
	if m.Reason != protocol.ReasonNotAllowed || m.ID != "n" || m.Room != "doc:1" {
		t.Errorf("a token without rooms: %+v", m)
	}

	c, err := secDialErr(gw.WS, bearer(roomToken(t, "alice", []string{"doc:*", "game:7"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Abort() })
	t.Cleanup(systest.KeepAlive(c, systest.Heartbeat))
	joinRoom(t, c, "a", "doc:1", "")
	joinRoom(t, c, "b", "game:7", "")
	sendRoom(t, c, protocol.TypeJoin, "c", "game:8", "")
	if m := systest.Await(t, c, systest.EventTimeout, "room_denied", isType(protocol.TypeRoomDenied)); m.Reason != protocol.ReasonNotAllowed || m.Room != "game:8" {
		t.Errorf("game:8: %+v", m)
	}

	// The renewal allows game:7 only: doc:1 is left, with room_denied and
	// no id, and its key goes.
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeAuth, Token: roomToken(t, "alice", []string{"game:*"})}); err != nil {
		t.Fatal(err)
	}
	m = systest.Await(t, c, systest.EventTimeout, "room_denied of doc:1", isType(protocol.TypeRoomDenied))
	if m.Reason != protocol.ReasonNotAllowed || m.Room != "doc:1" || m.ID != "" {
		t.Errorf("revoked: %+v", m)
	}
	natsCheckRoom(t, sys, "doc:1", nil)
	natsCheckRoom(t, sys, "game:7", []string{c.Hello.ConnID})
	joinRoom(t, c, "d", "game:8", "")

	// A rooms claim that is not a list of rooms refuses the token.
	if _, err := secDialErr(gw.WS, bearer(roomToken(t, "carol", []string{"doc.1"}))); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("a bad rooms claim: %v, want 401", err)
	}
}

// TestRoomKeysFollowANewLease: a gateway that finds its lease gone (here
// deleted by hand, as when NATS was out of reach for longer than the
// lease TTL) takes a new one and writes its connections' room keys again
// under it; the room's members stay members.
func TestRoomKeysFollowANewLease(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	alice := dialKept(t, sys, gw, "alice")
	joinRoom(t, alice, "j", "doc:1", `{"n":1}`)
	bob := dialKept(t, sys, gw, "bob")
	wb := joinRoom(t, bob, "j", "doc:1", "")

	ctx := t.Context()
	_, old := leaseOf(t, sys, gw.ID())
	natstest.CheckFor(t, systest.EventTimeout, 10*time.Millisecond, func() error {
		_, rev, err := sys.Store.Lease(ctx, old.Gateway, old.Epoch)
		if err != nil {
			return err
		}
		return sys.Store.DeleteLease(ctx, old.Gateway, old.Epoch, rev) // a refresh may land in between
	})
	natstest.CheckFor(t, 2*systest.EventTimeout, 50*time.Millisecond, func() error {
		entries, err := sys.Store.RoomMembers(ctx, "doc:1")
		if err != nil {
			return err
		}
		renewed := 0
		for _, e := range entries {
			if e.Member.Epoch != old.Epoch && e.Member.Gateway == gw.ID() && string(e.Value.Meta) != "" {
				renewed++
			}
		}
		// The reaper removes the keys under the lease that ended.
		if renewed != 2 || len(entries) != 2 {
			return fmt.Errorf("room keys %+v: want both connections' under a new lease, and only those", entries)
		}
		return nil
	})
	wb.until("alice and bob, under the new lease", func(w *roomWatch) bool {
		return w.count == 2 && w.members["alice"][alice.Hello.ConnID] == `{"n":1}`
	})
}

// TestRoomListedAgainAfterReconnect: a change a gateway missed while its
// NATS connection was down (here a key deleted with no event, as `nats kv
// del` would) is found when the gateway lists its rooms again on
// reconnecting, and its sockets get the diff.
func TestRoomListedAgainAfterReconnect(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	alice := dialKept(t, sys, gw, "alice")
	wa := joinRoom(t, alice, "j", "doc:3", "")
	ghost := presence.RoomMember{Room: "doc:3", Gateway: "gw-elsewhere", Epoch: "E1", UserID: "ghost", ConnID: "g1"}
	if _, err := sys.Store.PutRoomMember(t.Context(), ghost, presence.RoomValue{Meta: json.RawMessage(`{}`), Since: 1}); err != nil {
		t.Fatal(err)
	}
	bob := dialKept(t, sys, gw, "bob")
	joinRoom(t, bob, "j", "doc:3", "") // bob's join lists nothing new: the table is alice's
	wa.until("bob in", func(w *roomWatch) bool { return len(w.members["bob"]) == 1 })
	sendRoom(t, bob, protocol.TypeLeave, "", "doc:3", "")
	wa.until("bob out", func(w *roomWatch) bool { return len(w.members["bob"]) == 0 })
	if _, seen := wa.members["ghost"]; seen {
		t.Fatal("a key written with no event was seen before any listing")
	}

	cutNATS(t, sys, gw)
	// The client reconnects within about a second; on a loaded machine
	// the listing that follows may wait for a stalled watcher to be
	// replaced (after 2 s of silence), or fail and be tried again.
	wa.untilWithin(4*systest.EventTimeout, "the ghost, found by listing again", func(w *roomWatch) bool { return len(w.members["ghost"]) == 1 && w.count == 2 })
}

// TestRoomMembersOfADeadGateway: what a gateway that died leaves behind
// is its lease, no longer refreshed, and its room keys under it. Watchers
// of the room on a live gateway see those members leave once the lease
// has ended (about the lease TTL plus the reaper's work, 1.2 s here when
// the machine is quiet; the test logs it), never before; the members on
// the live gateway stay.
func TestRoomMembersOfADeadGateway(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	ctx := t.Context()
	dead := presence.RoomMember{Room: "doc:9", Gateway: "gw-dead", Epoch: "E1", UserID: "ghost", ConnID: "g1"}
	if _, err := sys.Store.CreateLease(ctx, presence.LeaseRecord{Gateway: dead.Gateway, Epoch: dead.Epoch}, systest.TTL); err != nil {
		t.Fatal(err)
	}
	leased := time.Now()
	if _, err := sys.Store.PutRoomMember(ctx, dead, presence.RoomValue{Meta: json.RawMessage(`{}`), Since: 1}); err != nil {
		t.Fatal(err)
	}
	gw := sys.Gateway()
	alice := dialKept(t, sys, gw, "alice")
	wa := joinRoom(t, alice, "j", "doc:9", "")
	bob := dialKept(t, sys, gw, "bob")
	joinRoom(t, bob, "j", "doc:9", "")
	if len(wa.members["ghost"]) != 1 {
		t.Fatalf("alice does not see the dead gateway's member: %v", wa.members)
	}
	// A loaded machine delays the lease's expiry and the reaper: the
	// wait has room for that (one CI run took over 6 s).
	wa.untilWithin(6*systest.EventTimeout, "the dead gateway's member gone", func(w *roomWatch) bool {
		_, in := w.members["ghost"]
		return !in && len(w.members["bob"]) == 1 && w.count == 2
	})
	took := time.Since(leased)
	t.Logf("the dead gateway's member left %v after its lease's last write", took.Round(time.Millisecond))
	if took < systest.TTL {
		t.Errorf("the dead gateway's member left %v after its lease's last write, before the lease's TTL (%v)", took, systest.TTL)
	}
	natsCheckRoom(t, sys, "doc:9", []string{alice.Hello.ConnID, bob.Hello.ConnID})
}

// roomAPI calls GET /api/rooms/{room} on g with the given query and
// headers, and decodes the answer into out.
func roomAPI(t *testing.T, g *systest.Gateway, room, query string, h http.Header, out any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, g.HTTP+"/api/rooms/"+room+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(req.Header, h)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET /api/rooms/%s: %d: %v", room, resp.StatusCode, err)
	}
	return resp.StatusCode
}

// roomAnswer is the body of GET /api/rooms/{room}, or of its errors.
type roomAnswer struct {
	Room      string                `json:"room"`
	Members   []protocol.RoomMember `json:"members"`
	Count     int                   `json:"count"`
	Truncated bool                  `json:"truncated"`
	Error     string                `json:"error"`
}

// TestRoomHTTP: GET /api/rooms/{room} lists a room's members as
// room_state does (the first users by id, with the true count), to
// whoever may join it.
func TestRoomHTTP(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{RoomMembersMax: 2}})
	gw := sys.Gateway()
	for _, u := range []string{"bob", "alice", "alice", "carol"} {
		joinRoom(t, dialKept(t, sys, gw, u), "j", "doc:1", `{"u":"`+u+`"}`)
	}
	var got roomAnswer
	natstest.CheckFor(t, systest.EventTimeout, 50*time.Millisecond, func() error {
		if code := roomAPI(t, gw, "doc:1", "?user=dave", nil, &got); code != http.StatusOK {
			return fmt.Errorf("status %d: %+v", code, got)
		}
		if got.Count != 3 || !got.Truncated || len(got.Members) != 2 || got.Members[0].UserID != "alice" ||
			len(got.Members[0].Conns) != 2 || got.Members[1].UserID != "bob" || string(got.Members[1].Conns[0].Meta) != `{"u":"bob"}` {
			return fmt.Errorf("answer %+v: want alice (2 connections) and bob of 3 users, truncated", got)
		}
		return nil
	})
	if code := roomAPI(t, gw, "doc:2", "?user=dave", nil, &got); code != http.StatusOK || got.Count != 0 || len(got.Members) != 0 || got.Members == nil {
		t.Errorf("an empty room: %d %+v", code, got)
	}
	if code := roomAPI(t, gw, "doc.1", "?user=dave", nil, &got); code != http.StatusBadRequest || got.Error != protocol.ReasonInvalidRoom {
		t.Errorf("a bad room id: %d %+v", code, got)
	}

	// With tokens, the rooms claim decides.
	tsys := secStart(t, systest.Options{})
	tgw := tsys.Gateway()
	for room, want := range map[string]int{"doc:1": http.StatusOK, "game:1": http.StatusForbidden} {
		got = roomAnswer{}
		if code := roomAPI(t, tgw, room, "", bearer(roomToken(t, "alice", []string{"doc:*"})), &got); code != want {
			t.Errorf("%s with rooms [doc:*]: %d %+v, want %d", room, code, got, want)
		}
	}
	if code := roomAPI(t, tgw, "doc:1", "", bearer(roomToken(t, "alice", nil)), &got); code != http.StatusForbidden || got.Error != protocol.ReasonNotAllowed {
		t.Errorf("a token without rooms: %d %+v", code, got)
	}
}

// awaitSignals reads c's frames until a room_signal of room, and returns
// its signals; every room_signal on the way must pass check.
func awaitSignals(t *testing.T, c *client.Conn, room string, check func(protocol.RoomSignalEntry)) []protocol.RoomSignalEntry {
	t.Helper()
	m := systest.Await(t, c, systest.EventTimeout, "room_signal of "+room, func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeRoomSignal && m.Room == room
	})
	for _, s := range m.Signals {
		check(s)
	}
	return m.Signals
}

// TestRoomSignals: typing and signals reach the other connections in the
// room, on every gateway, with their expiry; never the connection that
// sent them, never from an invisible user; bad ones are answered.
func TestRoomSignals(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{SignalRate: 0.01, SignalBurst: 3}})
	gw1 := sys.Gateway()
	gw2 := sys.StartGateway(gateway.Config{SignalRate: 0.01, SignalBurst: 3})
	alice := dialKept(t, sys, gw1, "alice")
	joinRoom(t, alice, "j", "doc:1", "")
	bob := dialKept(t, sys, gw2, "bob")
	joinRoom(t, bob, "j", "doc:1", "")
	carol := dialKept(t, sys, gw1, "carol")
	if err := carol.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, carol, presence.Invisible, 1)
	joinRoom(t, carol, "j", "doc:1", "")

	// carol's typing goes nowhere: the error that follows it says it was
	// handled.
	sendRoom(t, carol, protocol.TypeTyping, "", "doc:1", "")
	if err := carol.Send(protocol.ClientMessage{Type: protocol.TypeSignal, ID: "bad", Room: "doc:1", Signal: "Bad!"}); err != nil {
		t.Fatal(err)
	}
	if m := systest.Await(t, carol, systest.EventTimeout, "error", isType(protocol.TypeError)); m.ID != "bad" || m.Code != protocol.CodeBadRequest || !strings.Contains(m.Message, `"signal"`) {
		t.Errorf("a bad signal type: %+v", m)
	}

	sendRoom(t, bob, protocol.TypeTyping, "", "doc:1", "")
	notCarol := func(s protocol.RoomSignalEntry) {
		if s.UserID == "carol" {
			t.Errorf("a signal of invisible carol: %+v", s)
		}
	}
	got := awaitSignals(t, alice, "doc:1", notCarol)
	if len(got) != 1 || got[0].UserID != "bob" || got[0].ConnID != bob.Hello.ConnID || got[0].Signal != "typing" || got[0].ExpiresMS != 3000 || got[0].Data != nil {
		t.Errorf("alice got %+v, want bob typing for 3000 ms", got)
	}
	awaitSignals(t, carol, "doc:1", func(s protocol.RoomSignalEntry) {}) // invisible carol still gets them

	if err := alice.Send(protocol.ClientMessage{Type: protocol.TypeSignal, Room: "doc:1", Signal: "cursor", Data: json.RawMessage(`{"x": 1}`)}); err != nil {
		t.Fatal(err)
	}
	// bob gets alice's signal and never his own typing.
	got = awaitSignals(t, bob, "doc:1", func(s protocol.RoomSignalEntry) {
		if s.ConnID == bob.Hello.ConnID {
			t.Errorf("bob's own signal came back to him: %+v", s)
		}
		notCarol(s)
	})
	if len(got) != 1 || got[0].Signal != "cursor" || string(got[0].Data) != `{"x":1}` || got[0].UserID != "alice" {
		t.Errorf("bob got %+v, want alice's cursor", got)
	}

	for _, tc := range []struct {
		name string
		m    protocol.ClientMessage
		want string
	}{
		{"not joined", protocol.ClientMessage{Type: protocol.TypeTyping, Room: "doc:2"}, "not in room"},
		{"data too big", protocol.ClientMessage{Type: protocol.TypeSignal, Room: "doc:1", Signal: "x", Data: json.RawMessage(`"` + strings.Repeat("d", 300) + `"`)}, "at most 256"},
	} {
		tc.m.ID = tc.name
		if err := alice.Send(tc.m); err != nil {
			t.Fatal(err)
		}
		m := systest.Await(t, alice, systest.EventTimeout, tc.name, func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeError && m.ID == tc.name })
		if m.Code != protocol.CodeBadRequest || !strings.Contains(m.Message, tc.want) {
			t.Errorf("%s: %+v, want bad_request saying %q", tc.name, m, tc.want)
		}
	}
	// The burst of 3 is spent (alice sent 3): one more is rate limited.
	sendRoom(t, alice, protocol.TypeTyping, "over", "doc:1", "")
	m := systest.Await(t, alice, systest.EventTimeout, "rate limited", func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeError && m.ID == "over" })
	if m.Code != protocol.CodeRateLimited || !strings.Contains(m.Message, "--signal-rate") {
		t.Errorf("a fourth signal: %+v", m)
	}
}

// TestRoomLeaseEnded: presence.room.lease_ended makes every gateway drop
// the members held under that lease, whose leave events it may have
// missed; members of other leases stay. No reaper runs: its sweep ends
// members of leases that are over, as both of these are (neither lease
// exists), and a sweep between the writes and the join made the test
// fail on a loaded machine.
func TestRoomLeaseEnded(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{NoReaper: true})
	ctx := t.Context()
	for _, m := range []presence.RoomMember{
		{Room: "doc:8", Gateway: "gw-x", Epoch: "E1", UserID: "ghost", ConnID: "g1"},
		{Room: "doc:8", Gateway: "gw-x", Epoch: "E2", UserID: "later", ConnID: "l1"},
	} {
		if _, err := sys.Store.PutRoomMember(ctx, m, presence.RoomValue{Meta: json.RawMessage(`{}`), Since: 1}); err != nil {
			t.Fatal(err)
		}
	}
	alice := dialKept(t, sys, sys.Gateway(), "alice")
	wa := joinRoom(t, alice, "j", "doc:8", "")
	if wa.count != 3 {
		t.Fatalf("alice sees %v, want ghost, later and herself", wa.members)
	}
	data, err := json.Marshal(presence.RoomLeaseEnded{Gateway: "gw-x", Epoch: "E1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.NC.Publish(presence.RoomLeaseEndedSubject, data); err != nil {
		t.Fatal(err)
	}
	wa.until("the ended lease's member gone", func(w *roomWatch) bool {
		_, ghost := w.members["ghost"]
		return !ghost && len(w.members["later"]) == 1 && w.count == 2
	})
}

// TestRoomsStartNoGoroutines: a room's events and signals are handed to
// it by one goroutine of the gateway for all rooms, so joining rooms
// starts none (a subscription with a handler of its own would start one
// each, two per room).
func TestRoomsStartNoGoroutines(t *testing.T) {
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	const clients, rooms = 10, gateway.DefaultMaxRoomsPerConn
	conns := make([]*client.Conn, clients)
	for i := range conns {
		conns[i] = dialKept(t, sys, gw, fmt.Sprintf("u%d", i))
	}
	before := runtime.NumGoroutine()
	for i, c := range conns {
		for j := range rooms {
			joinRoom(t, c, "j", fmt.Sprintf("doc:%d-%d", i, j), "")
		}
	}
	after := runtime.NumGoroutine()
	t.Logf("goroutines: %d before %d rooms were joined, %d after", before, clients*rooms, after)
	if after-before >= clients*rooms {
		t.Errorf("joining %d rooms started %d goroutines", clients*rooms, after-before)
	}
	// The rooms work: a signal reaches the other member of one of them.
	bob := dialKept(t, sys, gw, "bob")
	joinRoom(t, bob, "j", "doc:0-0", "")
	sendRoom(t, bob, protocol.TypeTyping, "", "doc:0-0", "")
	if got := awaitSignals(t, conns[0], "doc:0-0", func(protocol.RoomSignalEntry) {}); len(got) != 1 || got[0].UserID != "bob" {
		t.Errorf("u0 got %+v, want bob typing", got)
	}
}

// TestRoomEventDroppedListedAgain: when the gateway falls so far behind
// that NATS drops a room's messages, a room that lost an event is listed
// again, and its members see what the event said; lost signals are only
// counted.
func TestRoomEventDroppedListedAgain(t *testing.T) {
	t.Parallel()
	const buffer = 16
	sys := systest.Start(t, systest.Options{Gateway: gateway.WithRoomMsgsBuffer(gateway.Config{}, buffer)})
	gw := sys.Gateway()
	alice := dialKept(t, sys, gw, "alice")
	wa := joinRoom(t, alice, "j", "doc:7", "")

	// The room's table is held: the first of its messages waits for it,
	// the next fill the buffer, and NATS drops the rest.
	unlock := gw.LockRoom("doc:7")
	if unlock == nil {
		t.Fatal("the gateway keeps no table of doc:7")
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	for i := range buffer + 10 {
		publishJSON(t, sys, presence.RoomSignalSubject("doc:7"),
			presence.RoomSignal{Room: "doc:7", UserID: "xavier", ConnID: fmt.Sprintf("x%d", i), Gateway: "gw-elsewhere", Signal: "typing"})
	}
	// Another gateway's member joins: its key is written, and its event
	// is dropped.
	ghost := presence.RoomMember{Room: "doc:7", Gateway: "gw-elsewhere", Epoch: "E1", UserID: "ghost", ConnID: "g1"}
	value := presence.RoomValue{Meta: json.RawMessage(`{}`), Since: 1}
	rev, err := sys.Store.PutRoomMember(t.Context(), ghost, value)
	if err != nil {
		t.Fatal(err)
	}
	publishJSON(t, sys, presence.RoomSubject("doc:7"), presence.RoomEvent{Room: ghost.Room, Op: presence.RoomJoin, UserID: ghost.UserID, ConnID: ghost.ConnID,
		Gateway: ghost.Gateway, Epoch: ghost.Epoch, Meta: value.Meta, Since: value.Since, Rev: rev})
	awaitDrops(t, gw, "room_event", 1)
	if n := gw.NATSDrops("room_signal"); n < 1 {
		t.Errorf("signal drops: %v, want at least 1", n)
	}
	unlock()
	locked = false
	wa.until("the ghost, found by listing again", func(w *roomWatch) bool { return len(w.members["ghost"]) == 1 && w.count == 2 })
}

// TestRoomListingsInTurn: two listings of one room (a NATS reconnect, a
// lost event) run one after the other. One that read the keys before a
// member joined must not end after one that read them after, or it
// would take the member out of the table again.
func TestRoomListingsInTurn(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	alice := dialKept(t, sys, gw, "alice")
	joinRoom(t, alice, "j", "doc:5", "")

	read, release := gw.HoldRoomListing()
	defer release()
	first := gw.ListRoomAgain("doc:5")
	select {
	case <-read:
	case <-time.After(systest.EventTimeout):
		t.Fatal("the first listing did not read the room's keys")
	}
	// A member of another gateway joins after the first listing read the
	// keys; its event is not needed to show the race, and none is sent.
	ghost := presence.RoomMember{Room: "doc:5", Gateway: "gw-elsewhere", Epoch: "E1", UserID: "ghost", ConnID: "g1"}
	if _, err := sys.Store.PutRoomMember(t.Context(), ghost, presence.RoomValue{Meta: json.RawMessage(`{}`), Since: 1}); err != nil {
		t.Fatal(err)
	}
	second := gw.ListRoomAgain("doc:5")
	// Were the listings not in turn, the second would end now, with the
	// ghost. In turn, it waits for the first: give it a while to show
	// that it does.
	select {
	case <-second:
		t.Error("a second listing ended while the first was still under way")
	case <-time.After(200 * time.Millisecond):
	}
	release()
	for _, done := range []<-chan struct{}{first, second} {
		select {
		case <-done:
		case <-time.After(systest.EventTimeout):
			t.Fatal("a listing did not end")
		}
	}
	want := []string{alice.Hello.ConnID, "g1"}
	slices.Sort(want)
	if got := gw.RoomConns("doc:5"); !slices.Equal(got, want) {
		t.Errorf("the table holds %v, want %v (the ghost listed by the second listing)", got, want)
	}
}

// TestRoomEventDroppedSilentlyListedAgain: NATS tells of the first message
// it drops of a subscription, not of those it drops after it until one
// gets through. A room whose event is dropped after it was listed again,
// while the gateway is still behind, is listed once more.
func TestRoomEventDroppedSilentlyListedAgain(t *testing.T) {
	t.Parallel()
	const buffer = 16
	sys := systest.Start(t, systest.Options{Gateway: gateway.WithRoomMsgsBuffer(gateway.Config{}, buffer)})
	gw := sys.Gateway()
	joinRoom(t, dialKept(t, sys, gw, "bob"), "j7", "doc:7", "")
	w8 := joinRoom(t, dialKept(t, sys, gw, "alice"), "j8", "doc:8", "")

	// doc:7's table is held: the first of its messages waits for it, the
	// next fill the buffer every room shares, and NATS drops the rest.
	unlock := gw.LockRoom("doc:7")
	if unlock == nil {
		t.Fatal("the gateway keeps no table of doc:7")
	}
	unlockOnce := sync.OnceFunc(unlock)
	defer unlockOnce()
	for i := range buffer + 10 {
		publishJSON(t, sys, presence.RoomSignalSubject("doc:7"),
			presence.RoomSignal{Room: "doc:7", UserID: "xavier", ConnID: fmt.Sprintf("x%d", i), Gateway: "gw-elsewhere", Signal: "typing"})
	}
	join := func(user string) {
		t.Helper()
		m := presence.RoomMember{Room: "doc:8", Gateway: "gw-elsewhere", Epoch: "E1", UserID: user, ConnID: user + "-1"}
		value := presence.RoomValue{Meta: json.RawMessage(`{}`), Since: 1}
		rev, err := sys.Store.PutRoomMember(t.Context(), m, value)
		if err != nil {
			t.Fatal(err)
		}
		publishJSON(t, sys, presence.RoomSubject("doc:8"), presence.RoomEvent{Room: m.Room, Op: presence.RoomJoin, UserID: m.UserID, ConnID: m.ConnID,
			Gateway: m.Gateway, Epoch: m.Epoch, Meta: value.Meta, Since: value.Since, Rev: rev})
	}
	// One member's event is dropped, told of, and doc:8 listed again...
	join("ghost")
	awaitDrops(t, gw, "room_event", 1)
	w8.until("the ghost, found by listing again", func(w *roomWatch) bool { return len(w.members["ghost"]) == 1 })
	// ...then another's, which NATS does not tell of.
	join("wraith")
	if err := sys.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	unlockOnce()
	w8.until("the wraith, found by listing once more", func(w *roomWatch) bool { return len(w.members["wraith"]) == 1 })
	if n := gw.NATSDrops("room_event"); n != 1 {
		t.Errorf("room event drops told of: %v, want 1", n)
	}
}
