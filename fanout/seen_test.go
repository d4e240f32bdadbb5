package fanout

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// TestSeenEventsPrune: what writers reported publishing is kept per user,
// the newest revision alone, public and self events apart, and forgotten
// once older than the prune's time, so that the memory holds no user for
// longer than seenFor without a new report.
func TestSeenEventsPrune(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newSeenEvents()
		e.noteAll(&presence.Published{Pub: map[string]uint64{"alice": 3}, Self: map[string]uint64{"alice": 3}})
		e.noteAll(&presence.Published{Pub: map[string]uint64{"alice": 2}}) // older: changes nothing
		time.Sleep(seenFor / 2)
		e.noteAll(&presence.Published{Pub: map[string]uint64{"bob": 5}})
		if !e.has("alice", false, 3) || e.has("alice", false, 4) || !e.has("alice", true, 2) || e.has("bob", true, 5) {
			t.Fatal("has: want alice's public and self events up to 3, and bob's public event alone")
		}
		time.Sleep(seenFor/2 + time.Second)
		e.prune(time.Now().Add(-seenFor))
		if e.has("alice", false, 1) || e.has("alice", true, 1) {
			t.Error("alice's events kept past seenFor")
		}
		if !e.has("bob", false, 5) {
			t.Error("bob's event forgotten before seenFor")
		}
	})
}
