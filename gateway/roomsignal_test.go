package gateway

import (
	"encoding/json"
	"testing"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// TestAppendSignals: the room_signal frame a socket is written is the one
// encoding/json writes of protocol.RoomSignal, its signals in order of
// user, connection and signal; the signals are taken with it.
func TestAppendSignals(t *testing.T) {
	sigs := []presence.RoomSignal{
		{Room: "doc:1", UserID: "carol", ConnID: "c2", Signal: "typing"},
		{Room: "doc:1", UserID: "bob", ConnID: "c9", Signal: "cursor", Data: json.RawMessage(`{"x":1,"html":"<b>&amp;</b>","s":"\u2028"}`)},
		{Room: "doc:1", UserID: "bob", ConnID: "c9", Signal: "typing"},
		{Room: "doc:1", UserID: "bob", ConnID: "c1", Signal: "typing"},
	}
	c := &conn{}
	v := &roomView{signals: make(map[signalKey]*pendingSignal)}
	for i := range sigs {
		p, err := newPendingSignal(&sigs[i])
		if err != nil {
			t.Fatal(err)
		}
		v.signals[signalKey{sigs[i].ConnID, sigs[i].Signal}] = p
	}
	r := &room{id: "doc:1", locals: map[*conn]*roomView{c: v}}

	want := protocol.RoomSignal{Type: protocol.TypeRoomSignal, Room: "doc:1"}
	for _, i := range []int{3, 1, 2, 0} {
		s := sigs[i]
		want.Signals = append(want.Signals, protocol.RoomSignalEntry{UserID: s.UserID, ConnID: s.ConnID,
			Signal: s.Signal, Data: s.Data, ExpiresMS: protocol.SignalExpiresMS})
	}
	wantJSON, err := json.Marshal(&want)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := r.appendSignals([]byte("scratch"), c)
	if !ok || string(got) != "scratch"+string(wantJSON) {
		t.Fatalf("frame %q (%v)\nwant %q", got, ok, wantJSON)
	}
	if got, ok := r.appendSignals(nil, c); ok || len(got) != 0 {
		t.Errorf("a second frame %q: the signals were not taken", got)
	}
	if got, ok := r.appendSignals(nil, &conn{}); ok || len(got) != 0 {
		t.Errorf("a frame %q for a socket not in the room", got)
	}
}
