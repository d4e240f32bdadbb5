package presence_test

import (
	"encoding/json"
	"testing"

	"github.com/greendot/greendot/pkg/presence"
)

// storedRecord is a status record as a gateway keeps and writes it: one
// connection, a chosen status, the unfed count.
var storedRecord = []byte(`{"chosen":"busy","conns":{"c0a8f3d2e1b4":{"gw":"gw-7f3a9c1e","lease":"1764170000123","device":"web","since":1764170000123}},"status":"busy","public":"busy","devices":1,"last_seen":1764170000,"since":1764170012345,"pv":12,"sv":14,"updated":1764170012345,"uf":3}`)

// BenchmarkCodec measures the encodings of the hot path: a status record
// decoded (each write from a writer's cached copy) and encoded (each
// write), and an event encoded (each publish) and decoded (each gateway
// that receives it).
func BenchmarkCodec(b *testing.B) {
	b.Run("record/decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := presence.UnfedOf(storedRecord); err != nil {
				b.Fatal(err)
			}
		}
	})
	var rec presence.Record
	if err := json.Unmarshal(storedRecord, &rec); err != nil {
		b.Fatal(err)
	}
	b.Run("record/encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	ev := presence.Event{UserID: "user-123456", Status: presence.Busy, LastSeen: 1764170000, Rev: 123456789, At: 1764170012345}
	data, err := presence.EncodeEvent(&ev)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("event/encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := presence.EncodeEvent(&ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("event/decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var got presence.Event
			if err := json.Unmarshal(data, &got); err != nil {
				b.Fatal(err)
			}
		}
	})
}
