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

	// Writing a socket's frame allocates nothing: its signals were
	// encoded when they came, and the buffer is the writer's.
	p, err := newPendingSignal(&sigs[0])
	if err != nil {
		t.Fatal(err)
	}
	waiting := map[signalKey]*pendingSignal{{sigs[0].ConnID, sigs[0].Signal}: p}
	buf := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(100, func() {
		v.signals = waiting
		buf, _ = r.appendSignals(buf[:0], c)
	}); n != 0 {
		t.Errorf("%v allocations per room_signal frame, want 0", n)
	}
}

// BenchmarkRoomSignalFrame: the room_signal frame of one typing signal for
// one socket, as the gateway writes it (its entry encoded once, for every
// socket it goes to, then appended), against marshalling the frame with
// encoding/json for each socket.
func BenchmarkRoomSignalFrame(b *testing.B) {
	sig := presence.RoomSignal{Room: "doc:1", UserID: "alice", ConnID: "c0123456789abcdef", Signal: protocol.SignalTyping}
	p, err := newPendingSignal(&sig)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("how=appended", func(b *testing.B) {
		c := &conn{}
		v := &roomView{}
		r := &room{id: sig.Room, locals: map[*conn]*roomView{c: v}}
		waiting := map[signalKey]*pendingSignal{{sig.ConnID, sig.Signal}: p}
		buf := make([]byte, 0, 4096)
		b.ReportAllocs()
		for b.Loop() {
			v.signals = waiting // taken by each frame; the map keeps its entry
			buf, _ = r.appendSignals(buf[:0], c)
		}
	})
	b.Run("how=marshalled", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			f := &protocol.RoomSignal{Type: protocol.TypeRoomSignal, Room: sig.Room, Signals: []protocol.RoomSignalEntry{{
				UserID: sig.UserID, ConnID: sig.ConnID, Signal: sig.Signal, ExpiresMS: protocol.SignalExpiresMS}}}
			if _, err := json.Marshal(f); err != nil {
				b.Fatal(err)
			}
		}
	})
}
