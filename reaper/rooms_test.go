package reaper_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
)

// joinRoom does what a gateway does when a connection joins a room: it
// writes the member's key under its lease. It returns the key's revision.
func (w *world) joinRoom(room, gw, epoch, user, conn string) uint64 {
	w.t.Helper()
	m := presence.RoomMember{Room: room, Gateway: gw, Epoch: epoch, UserID: user, ConnID: conn}
	rev, err := w.store.PutRoomMember(context.Background(), m, presence.RoomValue{Meta: json.RawMessage(`{}`), Since: 1})
	if err != nil {
		w.t.Fatal(err)
	}
	return rev
}

// roomConns returns the connections with a key in a room, sorted.
func (w *world) roomConns(room string) []string {
	w.t.Helper()
	entries, err := w.store.RoomMembers(context.Background(), room)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Member.ConnID)
	}
	slices.Sort(out)
	return out
}

// roomEvents collects what the reaper publishes on the room subjects.
type roomEvents struct {
	leaves []presence.RoomEvent
	ended  []presence.RoomLeaseEnded
}

// awaitRoomEvents reads sub until it has n leaves and a lease end.
func awaitRoomEvents(t *testing.T, sub *nats.Subscription, n int) roomEvents {
	t.Helper()
	var got roomEvents
	deadline := time.Now().Add(patience)
	for len(got.leaves) < n || len(got.ended) == 0 {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("room events: %v; have %+v", err, got)
		}
		if m.Subject == presence.RoomLeaseEndedSubject {
			var ev presence.RoomLeaseEnded
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatal(err)
			}
			got.ended = append(got.ended, ev)
			continue
		}
		var ev presence.RoomEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if m.Subject != presence.RoomSubject(ev.Room) {
			t.Errorf("event of room %s on %s", ev.Room, m.Subject)
		}
		got.leaves = append(got.leaves, ev)
	}
	return got
}

// TestLeaseEndEndsItsRoomMemberships: a gateway dies (its lease expires):
// every room key held under the lease goes, each with a leave on its
// room's subject carrying the key's revision, and then the lease's end is
// told to every gateway; the keys of another lease stay.
func TestLeaseEndEndsItsRoomMemberships(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	sub, err := w.nc.SubscribeSync(presence.RoomWildcard)
	if err != nil {
		t.Fatal(err)
	}
	w.startReaper(reaper.Config{})
	w.takeLease("gw1", "E1", time.Second)
	w.takeLease("gw2", "F1", time.Hour)
	revs := map[string]uint64{
		"a1": w.joinRoom("doc:42", "gw1", "E1", "alice", "a1"),
		"a2": w.joinRoom("game:7", "gw1", "E1", "alice", "a2"),
	}
	w.joinRoom("doc:42", "gw2", "F1", "bob", "b1")

	got := awaitRoomEvents(t, sub, 2)
	for _, ev := range got.leaves {
		if ev.Op != presence.RoomLeave || ev.Gateway != "gw1" || ev.Epoch != "E1" || ev.UserID != "alice" || ev.Rev != revs[ev.ConnID] {
			t.Errorf("leave %+v, want alice's under gw1.E1 at the key's revision", ev)
		}
	}
	if got.ended[0] != (presence.RoomLeaseEnded{Gateway: "gw1", Epoch: "E1"}) {
		t.Errorf("lease end %+v", got.ended[0])
	}
	if c := w.roomConns("doc:42"); !slices.Equal(c, []string{"b1"}) {
		t.Errorf("doc:42 keys %v, want b1's only", c)
	}
	if c := w.roomConns("game:7"); len(c) != 0 {
		t.Errorf("game:7 keys %v, want none", c)
	}
}

// TestSweepEndsRoomMembershipsOfLeasesThatAreOver: room keys left under a
// lease that is over (its end unseen, or applied half-way) are removed by
// the sweep, with their leaves; those of live leases stay.
func TestSweepEndsRoomMembershipsOfLeasesThatAreOver(t *testing.T) {
	w := newWorld(t, presence.BucketOptions{MarkerTTL: time.Second})
	sub, err := w.nc.SubscribeSync(presence.RoomWildcard)
	if err != nil {
		t.Fatal(err)
	}
	w.takeLease("gw2", "F1", time.Hour)
	w.joinRoom("doc:1", "gw1", "gone", "alice", "a1") // a lease that never was
	w.joinRoom("doc:1", "gw2", "F1", "bob", "b1")
	w.startReaper(reaper.Config{})
	got := awaitRoomEvents(t, sub, 1)
	if got.leaves[0].ConnID != "a1" || got.ended[0] != (presence.RoomLeaseEnded{Gateway: "gw1", Epoch: "gone"}) {
		t.Errorf("events %+v", got)
	}
	natstest.CheckFor(t, patience, 20*time.Millisecond, func() error {
		if c := w.roomConns("doc:1"); !slices.Equal(c, []string{"b1"}) {
			return fmt.Errorf("doc:1 keys %v, want b1's only", c)
		}
		return nil
	})
}
