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
	}
	want, err := json.Marshal(protocol.PresenceBatch{Type: protocol.TypePresenceBatch, Updates: updates})
	if err != nil {
		t.Fatal(err)
	}
	if got := protocol.AppendBatch(nil, updates); string(got) != string(want) {
		t.Errorf("AppendBatch =\n%s\nencoding/json:\n%s", got, want)
	}
	if got := string(all.AppendJSON(nil)); got != `{"web":"idle","desktop":"active","mobile":"idle"}` {
		t.Errorf("platforms = %s, want web, desktop, mobile in that order", got)
	}
}
