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
// decoded (each write from a writer's cached copy), its versions alone
// decoded (the fanout, each revision) and the record encoded (each
// write), and an event encoded (each publish) and decoded (each gateway
// that receives it).
func BenchmarkCodec(b *testing.B) {
	var rec presence.Record
	if err := json.Unmarshal(storedRecord, &rec); err != nil {
		b.Fatal(err)
	}
	ev := presence.Event{UserID: "user-123456", Status: presence.Busy, LastSeen: 1764170000, Rev: 123456789, At: 1764170012345}
	event, err := presence.EncodeEvent(&ev)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"record/decode", func() error { _, err := presence.UnfedOf(storedRecord); return err }},
		{"record/versions", func() error { var v presence.Versions; return json.Unmarshal(storedRecord, &v) }},
		{"record/encode", func() error { _, err := json.Marshal(&rec); return err }},
		{"event/encode", func() error { _, err := presence.EncodeEvent(&ev); return err }},
		{"event/decode", func() error { var got presence.Event; return json.Unmarshal(event, &got) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
