package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// TestAppendBatchIsJSON: the hand-written encoder writes what
// encoding/json writes for PresenceBatch, platforms and all.
func TestAppendBatchIsJSON(t *testing.T) {
	t.Parallel()
	var web, all presence.Platforms
	if err := json.Unmarshal([]byte(`{"web":"active"}`), &web); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"mobile":"idle","web":"idle","desktop":"active"}`), &all); err != nil {
		t.Fatal(err)
	}
	updates := []presence.Presence{
		{UserID: "alice", Status: presence.Online},
		{UserID: "bob", Status: presence.Offline, LastSeen: 1765000000},
		{UserID: "carol", Status: presence.Away, Platforms: web},
		{UserID: "dave", Status: presence.Busy, LastSeen: 1765000001, Platforms: all},
		{UserID: "erin", Status: presence.Offline, Custom: &presence.Custom{Text: `Out <"sick"> & \ back   soon`, Emoji: "🤒", ExpiresAt: 1765000002}},
		{UserID: "frank", Status: presence.Online, Platforms: web, Custom: &presence.Custom{Emoji: ":palm_tree:"}},
	}
	want, err := json.Marshal(protocol.PresenceBatch{Type: protocol.TypePresenceBatch, Updates: updates})
	if err != nil {
		t.Fatal(err)
	}
	if got := protocol.AppendBatch(nil, updates); string(got) != string(want) {
		t.Errorf("AppendBatch =\n%s\nencoding/json:\n%s", got, want)
	}
	self := protocol.Self{Type: protocol.TypeSelf, Status: presence.Busy, Devices: 2, Custom: updates[4].Custom}
	if want, err := json.Marshal(self); err != nil || string(protocol.AppendSelf(nil, self.Status, self.Devices, self.Custom)) != string(want) {
		t.Errorf("AppendSelf = %s, encoding/json: %s (%v)", protocol.AppendSelf(nil, self.Status, self.Devices, self.Custom), want, err)
	}
	if got := string(all.AppendJSON(nil)); got != `{"web":"idle","desktop":"active","mobile":"idle"}` {
		t.Errorf("platforms = %s, want web, desktop, mobile in that order", got)
	}
}
