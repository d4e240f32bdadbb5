package presence_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/presence"
)

func TestValidRoomID(t *testing.T) {
	for id, want := range map[string]bool{
		"doc:42":                      true,
		"game:7:lobby":                true,
		"chat_room-1":                 true,
		":":                           true,
		strings.Repeat("r", 128):      true,
		strings.Repeat("r", 129):      false,
		"":                            false,
		"doc.42":                      false, // a subject token separator
		"doc=42":                      false, // what ':' becomes in keys
		"doc 42":                      false,
		"doc*":                        false,
		presence.LeaseEndedRoom:       false, // its subject is taken
		presence.LeaseEndedRoom + "x": true,
	} {
		if got := presence.ValidRoomID(id); got != want {
			t.Errorf("ValidRoomID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestRoomNames(t *testing.T) {
	if got := presence.RoomToken("game:7:lobby"); got != "game=7=lobby" {
		t.Errorf("RoomToken = %q", got)
	}
	if id, ok := presence.RoomIDOf("game=7=lobby"); !ok || id != "game:7:lobby" {
		t.Errorf("RoomIDOf = %q, %v", id, ok)
	}
	if _, ok := presence.RoomIDOf("a.b"); ok {
		t.Error("RoomIDOf took a token with a dot")
	}
	m := presence.RoomMember{Room: "doc:42", Gateway: "gw1", Epoch: "E1", UserID: "alice", ConnID: "c1"}
	if m.Key() != "doc=42.gw1.E1.alice.c1" {
		t.Errorf("Key = %q", m.Key())
	}
	if got, ok := presence.ParseRoomKey(m.Key()); !ok || got != m {
		t.Errorf("ParseRoomKey(%q) = %+v, %v", m.Key(), got, ok)
	}
	for _, bad := range []string{"doc=42.gw1.E1.alice", "doc=42.gw1.E1.alice.c1.x", "a b.gw1.E1.alice.c1", "doc=42.gw1.E1.al ice.c1"} {
		if _, ok := presence.ParseRoomKey(bad); ok {
			t.Errorf("ParseRoomKey(%q) took it", bad)
		}
	}
	if presence.RoomSubject("doc:42") != "presence.room.doc=42" || presence.RoomSignalSubject("doc:42") != "presence.room.doc=42.signal" {
		t.Errorf("subjects %q %q", presence.RoomSubject("doc:42"), presence.RoomSignalSubject("doc:42"))
	}
	if presence.RoomLeaseEndedSubject != "presence.room.lease_ended" {
		t.Errorf("lease ended subject %q", presence.RoomLeaseEndedSubject)
	}
	if presence.RoomKeysFilter("doc:42") != "doc=42.>" || presence.LeaseRoomKeysFilter("gw1", "E1") != "*.gw1.E1.>" {
		t.Error("filters")
	}
}

// TestRoomStore writes, lists, deletes and purges room keys in a real
// bucket, and checks that a watcher of the bucket sees a member's delete.
func TestRoomStore(t *testing.T) {
	st, _ := openStore(t, presence.BucketOptions{})
	ctx := context.Background()
	kv := bucketKV(t, st, presence.RoomsBucket)
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()

	member := func(room, gw, epoch, user, conn string) presence.RoomMember {
		return presence.RoomMember{Room: room, Gateway: gw, Epoch: epoch, UserID: user, ConnID: conn}
	}
	a := member("doc:42", "gw1", "E1", "alice", "c1")
	b := member("doc:42", "gw2", "E9", "bob", "c2")
	c := member("doc:7", "gw1", "E1", "carol", "c3")
	meta := json.RawMessage(`{"cursor":3}`)
	for _, m := range []presence.RoomMember{a, b, c} {
		if _, err := st.PutRoomMember(ctx, m, presence.RoomValue{Meta: meta, Since: 1}); err != nil {
			t.Fatal(err)
		}
	}
	rev, err := st.PutRoomMember(ctx, a, presence.RoomValue{Meta: json.RawMessage(`{"cursor":4}`), Since: 1})
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.RoomMembers(ctx, "doc:42")
	if err != nil {
		t.Fatal(err)
	}
	// The listing is in the order of the keys' newest revisions.
	if len(got) != 2 || got[0].Member != b || got[1].Member != a || got[1].Rev != rev || string(got[1].Value.Meta) != `{"cursor":4}` {
		t.Fatalf("members of doc:42 = %+v", got)
	}

	del, err := st.DeleteRoomMember(ctx, b)
	if err != nil || del <= rev {
		t.Fatalf("delete: rev %d, %v", del, err)
	}
	seen := false
	for !seen {
		select {
		case e := <-w.Updates():
			seen = e != nil && e.Key() == b.Key() && e.Operation() == jetstream.KeyValueDelete && e.Revision() == del
		case <-time.After(5 * time.Second):
			t.Fatal("the watcher did not see the member's delete")
		}
	}
	if got, err := st.RoomMembers(ctx, "doc:42"); err != nil || len(got) != 1 || got[0].Member != a {
		t.Fatalf("members after the delete = %+v, %v", got, err)
	}

	lease, err := st.LeaseRoomKeys(ctx, "gw1", "E1")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range lease {
		keys = append(keys, e.Member.Key())
	}
	slices.Sort(keys)
	if want := []string{a.Key(), c.Key()}; !slices.Equal(keys, want) {
		t.Fatalf("keys of lease gw1.E1 = %v, want %v", keys, want)
	}
	if err := st.PurgeLeaseRooms(ctx, "gw1", "E1"); err != nil {
		t.Fatal(err)
	}
	if all, err := st.ScanRoomKeys(ctx); err != nil || len(all) != 0 {
		t.Fatalf("room keys after the purge = %+v, %v", all, err)
	}
}
