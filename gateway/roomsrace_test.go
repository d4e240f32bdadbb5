package gateway_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// putRoomKey writes a room key of m, as its gateway would, and returns
// its revision.
func putRoomKey(t *testing.T, sys *systest.System, m presence.RoomMember) uint64 {
	t.Helper()
	rev, err := sys.Store.PutRoomMember(t.Context(), m, presence.RoomValue{Meta: json.RawMessage(`{}`), Since: 1})
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestRoomJoinQueuedBeforeRenewal: an auth renewal that comes while 16
// requests wait revokes at once the rooms its token no longer allows (its
// revocation cannot wait in the full queue). A join queued before the
// renewal, for a room the new token does not allow, is refused when its
// turn comes, with room_denied not_allowed, and leaves no key.
func TestRoomJoinQueuedBeforeRenewal(t *testing.T) {
	t.Parallel()
	sys, gw, c := docsAlice(t)
	joinRoom(t, c, "a", "doc:0", "")

	// alice's requests wait behind her subscribe, held between the
	// gateway's decision and its registration.
	held, releaseOnce := holdDecision(t, gw)
	if err := c.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, held, "the subscribe to reach the authorizer")
	sendRoom(t, c, protocol.TypeJoin, "j", "doc:1", "")
	for i := range gateway.MaxQueued - 1 {
		sendRoom(t, c, protocol.TypeLeave, "", fmt.Sprintf("doc:x%d", i), "")
	}
	// The queue is full: one more is refused.
	sendRoom(t, c, protocol.TypeLeave, "full", "doc:y", "")
	if m := systest.Await(t, c, systest.EventTimeout, "refusal", func(m protocol.ServerMessage) bool { return m.ID == "full" }); m.Code != protocol.CodeRateLimited {
		t.Fatalf("a 17th request: %+v, want rate_limited", m)
	}

	// The renewal allows game rooms only: doc:0 is revoked at once.
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeAuth, Token: roomToken(t, "alice", []string{"game:*"})}); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, c, systest.EventTimeout, "room_denied of doc:0", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeRoomDenied && m.Room == "doc:0" && m.ID == ""
	})
	releaseOnce()
	m := systest.Await(t, c, systest.EventTimeout, "the answer to join j", func(m protocol.ServerMessage) bool {
		return m.ID == "j" && (m.Type == protocol.TypeRoomState || m.Type == protocol.TypeRoomDenied)
	})
	if m.Type != protocol.TypeRoomDenied || m.Reason != protocol.ReasonNotAllowed || m.Room != "doc:1" {
		t.Errorf("join of doc:1 queued before the renewal: %+v, want room_denied not_allowed", m)
	}
	// Once a later join is answered, every queued request has run: doc:1
	// has no key, and the gateway no table of it.
	joinRoom(t, c, "g", "game:1", "")
	natsCheckRoom(t, sys, "doc:1", nil)
	if conns := gw.RoomConns("doc:1"); conns != nil {
		t.Errorf("the gateway keeps a table of doc:1: %v", conns)
	}
}

// TestRoomRenewalDuringJoin: an auth renewal whose revocation runs at
// once (16 requests wait) while a join is under way, for a room the new
// token does not allow, takes the connection out of that room once the
// join is over: the revocation waits for it rather than looking for the
// room before the join made it a member.
func TestRoomRenewalDuringJoin(t *testing.T) {
	t.Parallel()
	sys, gw, c := docsAlice(t)

	// The join is held once it has read the room's keys.
	read, release := gw.HoldRoomListing()
	defer release()
	sendRoom(t, c, protocol.TypeJoin, "j", "doc:1", "")
	awaitClosed(t, read, "the join to list doc:1")
	for i := range gateway.MaxQueued {
		sendRoom(t, c, protocol.TypeLeave, "", fmt.Sprintf("doc:x%d", i), "")
	}
	// The renewal, between two requests refused for the full queue: the
	// second refusal says it was taken.
	refused := func(id string) {
		t.Helper()
		sendRoom(t, c, protocol.TypeLeave, id, "doc:y", "")
		if m := systest.Await(t, c, systest.EventTimeout, "refusal", func(m protocol.ServerMessage) bool { return m.ID == id }); m.Code != protocol.CodeRateLimited {
			t.Fatalf("a request beyond the queue: %+v, want rate_limited", m)
		}
	}
	refused("full")
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeAuth, Token: roomToken(t, "alice", []string{"game:*"})}); err != nil {
		t.Fatal(err)
	}
	refused("renewed")
	release()

	// The join was allowed when it began: it is answered, then revoked.
	systest.Await(t, c, systest.EventTimeout, "room_state j", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeRoomState && m.ID == "j"
	})
	systest.Await(t, c, systest.EventTimeout, "room_denied of doc:1", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeRoomDenied && m.Room == "doc:1" && m.ID == "" && m.Reason == protocol.ReasonNotAllowed
	})
	natsCheckRoom(t, sys, "doc:1", nil)
}

// TestRoomListingAfterReaperLeave: the reaper ends a dead lease's
// memberships with a leave per key, then removes the keys. A listing of
// the room (after a reconnect, or lost events) that reads the keys in
// between must not bring the member back. No reaper runs: the test plays
// its part.
func TestRoomListingAfterReaperLeave(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{NoReaper: true})
	gw := sys.Gateway()
	ghost := presence.RoomMember{Room: "doc:1", Gateway: "gw-dead", Epoch: "E1", UserID: "ghost", ConnID: "g1"}
	rev := putRoomKey(t, sys, ghost)
	alice := dialKept(t, sys, gw, "alice")
	wa := joinRoom(t, alice, "j", "doc:1", "")
	if len(wa.members["ghost"]) != 1 {
		t.Fatalf("alice sees %v, want the ghost and herself", wa.members)
	}
	publishJSON(t, sys, presence.RoomSubject("doc:1"), presence.RoomEvent{Room: "doc:1", Op: presence.RoomLeave,
		UserID: ghost.UserID, ConnID: ghost.ConnID, Gateway: ghost.Gateway, Epoch: ghost.Epoch, Rev: rev})
	wa.until("the ghost gone", func(w *roomWatch) bool { _, in := w.members["ghost"]; return !in && w.count == 1 })

	// The ghost's key is still there.
	awaitClosed(t, gw.ListRoomAgain("doc:1"), "the listing")
	if conns := gw.RoomConns("doc:1"); slices.Contains(conns, ghost.ConnID) {
		t.Errorf("the listing brought the ghost back: the table holds %v", conns)
	}
	// Nor is alice told of it: bob's join, after the listing, comes after
	// anything the listing changed.
	bob := dialKept(t, sys, gw, "bob")
	joinRoom(t, bob, "j", "doc:1", "")
	wa.until("bob", func(w *roomWatch) bool { return len(w.members["bob"]) == 1 })
	if _, in := wa.members["ghost"]; in || wa.count != 2 {
		t.Errorf("alice sees %v (count %d), want bob and herself", wa.members, wa.count)
	}
}

// TestRoomLeaseEndedWhileListing: a lease_ended that comes while a room's
// keys are listed (here its first listing, as a connection joins it) is
// applied after the listing, which may have read the lease's keys before
// the reaper removed them. No reaper runs: the test plays its part.
func TestRoomLeaseEndedWhileListing(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{NoReaper: true})
	gw := sys.Gateway()
	putRoomKey(t, sys, presence.RoomMember{Room: "doc:1", Gateway: "gw-dead", Epoch: "E1", UserID: "ghost", ConnID: "g1"})
	// bob's room tells when the gateway has handled a lease_ended.
	putRoomKey(t, sys, presence.RoomMember{Room: "doc:2", Gateway: "gw-other", Epoch: "E2", UserID: "canary", ConnID: "c1"})
	bob := dialKept(t, sys, gw, "bob")
	wb := joinRoom(t, bob, "j", "doc:2", "")
	if len(wb.members["canary"]) != 1 {
		t.Fatalf("bob sees %v, want the canary and himself", wb.members)
	}

	read, release := gw.HoldRoomListing()
	defer release()
	alice := dialKept(t, sys, gw, "alice")
	sendRoom(t, alice, protocol.TypeJoin, "j", "doc:1", "")
	awaitClosed(t, read, "the listing of doc:1 to read its keys")
	if err := sys.Store.PurgeLeaseRooms(t.Context(), "gw-dead", "E1"); err != nil {
		t.Fatal(err)
	}
	publishJSON(t, sys, presence.RoomLeaseEndedSubject, presence.RoomLeaseEnded{Gateway: "gw-dead", Epoch: "E1"})
	// lease_ended messages are handled one at a time, in order: once the
	// canary's is, the ghost's was.
	publishJSON(t, sys, presence.RoomLeaseEndedSubject, presence.RoomLeaseEnded{Gateway: "gw-other", Epoch: "E2"})
	wb.until("the canary gone", func(w *roomWatch) bool { _, in := w.members["canary"]; return !in })
	release()

	st := systest.Await(t, alice, systest.EventTimeout, "room_state j", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeRoomState && m.ID == "j"
	})
	wa := &roomWatch{tb: t, c: alice, room: "doc:1"}
	wa.take(st)
	if !slices.Equal(wa.users(), []string{"alice"}) || wa.count != 1 {
		t.Errorf("alice's room_state shows %v (count %d), want herself only", wa.members, wa.count)
	}
	if conns := gw.RoomConns("doc:1"); !slices.Equal(conns, []string{alice.Hello.ConnID}) {
		t.Errorf("the table holds %v, want alice's connection only", conns)
	}
}

// TestRoomTruncatedViewLetsLogTrim: a socket shown a truncated room is not
// told of the meta changes of users it was not shown. The room's change
// log must drop them all the same, or it would keep every one (up to
// --room-meta-max each) until the count moved. No reaper runs: it would
// remove zed, whose lease does not exist.
func TestRoomTruncatedViewLetsLogTrim(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{NoReaper: true, Gateway: gateway.Config{RoomMembersMax: 1}})
	gw := sys.Gateway()
	zed := presence.RoomMember{Room: "doc:1", Gateway: "gw-x", Epoch: "E1", UserID: "zed", ConnID: "z1"}
	rev := putRoomKey(t, sys, zed)
	alice := dialKept(t, sys, gw, "alice")
	wa := joinRoom(t, alice, "j", "doc:1", `{"n":0}`)
	if !wa.truncated || wa.count != 2 || !slices.Equal(wa.users(), []string{"alice"}) {
		t.Fatalf("alice's room_state: truncated %v, count %d, users %v; want truncated, 2, [alice]", wa.truncated, wa.count, wa.users())
	}

	const updates = 8 * gateway.RoomLogMinTrim
	for i := 1; i <= updates; i++ {
		publishJSON(t, sys, presence.RoomSubject("doc:1"), presence.RoomEvent{Room: "doc:1", Op: presence.RoomUpdate, UserID: zed.UserID, ConnID: zed.ConnID,
			Gateway: zed.Gateway, Epoch: zed.Epoch, Meta: json.RawMessage(fmt.Sprintf(`{"x":%d}`, i)), Rev: rev + uint64(i)})
	}
	// A user joins and the count moves: alice hears of it once every
	// update, handed to the room before it, was applied.
	publishJSON(t, sys, presence.RoomSubject("doc:1"), presence.RoomEvent{Room: "doc:1", Op: presence.RoomJoin, UserID: "yan", ConnID: "y1",
		Gateway: zed.Gateway, Epoch: zed.Epoch, Meta: json.RawMessage(`{}`), Rev: 1})
	wa.until("the count of 3", func(w *roomWatch) bool { return w.count == 3 })
	if n := gw.RoomLogLen("doc:1"); n >= gateway.RoomLogMinTrim {
		t.Errorf("the room's log holds %d changes after %d meta changes nobody here follows; want fewer than %d", n, updates, gateway.RoomLogMinTrim)
	}
	// alice still gets the changes of the users she was shown.
	sendRoom(t, alice, protocol.TypeRoomUpdate, "", "doc:1", `{"n":1}`)
	wa.until("alice's new meta", func(w *roomWatch) bool { return w.members["alice"][alice.Hello.ConnID] == `{"n":1}` })
	if !slices.Equal(wa.users(), []string{"alice"}) || wa.count != 3 {
		t.Errorf("alice sees %v (count %d), want herself only and 3", wa.members, wa.count)
	}
}

// docsAlice starts a system whose JWTs are checked, and connects alice
// with a token for the doc rooms, kept alive.
func docsAlice(t *testing.T) (*systest.System, *systest.Gateway, *client.Conn) {
	t.Helper()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	c, err := secDialErr(gw.WS, bearer(roomToken(t, "alice", []string{"doc:*"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Abort() })
	t.Cleanup(systest.KeepAlive(c, systest.Heartbeat))
	return sys, gw, c
}
