package protocol_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// clientMessages are typical client messages, by name.
var clientMessages = []struct{ name, json string }{
	{"heartbeat", `{"type":"heartbeat"}`},
	{"set_status", `{"type":"set_status","status":"busy","id":"r1"}`},
	{"subscribe=10", subscribeJSON(10)},
	{"subscribe=100", subscribeJSON(100)},
}

func subscribeJSON(n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf(`"user-%d"`, i)
	}
	return `{"type":"subscribe","id":"s1","user_ids":[` + strings.Join(ids, ",") + `]}`
}

func BenchmarkDecodeClient(b *testing.B) {
	for _, m := range clientMessages {
		b.Run("msg="+m.name, func(b *testing.B) {
			data := []byte(m.json)
			var msg protocol.ClientMessage
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if err := protocol.DecodeClient(data, &msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// updates returns n presence objects, half of them with last_seen.
func updates(n int) []presence.Presence {
	out := make([]presence.Presence, n)
	for i := range out {
		out[i] = presence.Presence{UserID: fmt.Sprintf("user-%d", i), Status: presence.Online}
		if i%2 == 0 {
			out[i].Status, out[i].LastSeen = presence.Offline, 1_760_000_000+int64(i)
		}
	}
	return out
}

func BenchmarkAppendBatch(b *testing.B) {
	for _, n := range []int{1, 10, 100, 500} {
		b.Run(fmt.Sprintf("updates=%d", n), func(b *testing.B) {
			u := updates(n)
			buf := protocol.AppendBatch(nil, u)
			b.ReportAllocs()
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				buf = protocol.AppendBatch(buf[:0], u)
			}
		})
	}
}

func BenchmarkAppendSelf(b *testing.B) {
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = protocol.AppendSelf(buf[:0], presence.Busy, 3, nil)
	}
}

// TestAppendAllocs pins the frame encoders of the delivery path at zero
// allocations once the buffer has grown.
func TestAppendAllocs(t *testing.T) {
	u := updates(100)
	buf := protocol.AppendBatch(nil, u)
	if n := testing.AllocsPerRun(100, func() { buf = protocol.AppendBatch(buf[:0], u) }); n != 0 {
		t.Errorf("AppendBatch: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { buf = protocol.AppendSelf(buf[:0], presence.Away, 2, nil) }); n != 0 {
		t.Errorf("AppendSelf: %v allocations, want 0", n)
	}
	p := u[0]
	if n := testing.AllocsPerRun(100, func() { buf = protocol.AppendPresence(buf[:0], &p) }); n != 0 {
		t.Errorf("AppendPresence: %v allocations, want 0", n)
	}
}

// TestDecodeClientTypeOnly checks that the messages DecodeClient decodes
// without the JSON decoder come out as the decoder would make them, also
// when they differ from the usual form by a byte, and pins them at zero
// allocations.
func TestDecodeClientTypeOnly(t *testing.T) {
	for _, typ := range []string{protocol.TypeHeartbeat, protocol.TypeActivity, protocol.TypeIdle} {
		for _, data := range []string{
			`{"type":"` + typ + `"}`,
			` {"type":"` + typ + `"} `,
			`{"type": "` + typ + `"}`,
			`{"type":"` + typ + `","id":"x"}`,
			`{"type":"` + typ + `x"}`,
		} {
			var got, want protocol.ClientMessage
			if err := protocol.DecodeClient([]byte(data), &got); err != nil {
				t.Errorf("%s: %v", data, err)
				continue
			}
			if err := json.Unmarshal([]byte(data), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: got %+v, want %+v", data, got, want)
			}
		}
		data := []byte(`{"type":"` + typ + `"}`)
		var m protocol.ClientMessage
		if n := testing.AllocsPerRun(100, func() { _ = protocol.DecodeClient(data, &m) }); n != 0 {
			t.Errorf("DecodeClient(%s): %v allocations, want 0", data, n)
		}
	}
	// A decoded message replaces what m held.
	m := protocol.ClientMessage{ID: "old", Status: "busy", UserIDs: []string{"a"}}
	if err := protocol.DecodeClient([]byte(`{"type":"heartbeat"}`), &m); err != nil || !reflect.DeepEqual(m, protocol.ClientMessage{Type: protocol.TypeHeartbeat}) {
		t.Errorf("got %+v, %v", m, err)
	}
}

func TestIsHeartbeat(t *testing.T) {
	for data, want := range map[string]bool{
		`{"type":"heartbeat"}`:          true,
		" {\"type\":\"heartbeat\"}\n":   true,
		`{"type": "heartbeat"}`:         false, // a heartbeat, but decoded the usual way
		`{"type":"heartbeat","id":"1"}`: false,
		`{"type":"activity"}`:           false,
		``:                              false,
	} {
		if got := protocol.IsHeartbeat([]byte(data)); got != want {
			t.Errorf("IsHeartbeat(%q) = %v, want %v", data, got, want)
		}
		if want {
			var m protocol.ClientMessage
			if err := protocol.DecodeClient([]byte(data), &m); err != nil || m.Type != protocol.TypeHeartbeat {
				t.Errorf("DecodeClient(%q) = %+v, %v: IsHeartbeat must agree with it", data, m, err)
			}
		}
	}
	data := []byte(`{"type":"heartbeat"}`)
	if n := testing.AllocsPerRun(100, func() { protocol.IsHeartbeat(data) }); n != 0 {
		t.Errorf("IsHeartbeat: %v allocations, want 0", n)
	}
}
