package webhook

import (
	"slices"
	"testing"
	"time"
)

// TestAdopt: users kept in presence_webhook_resync are remembered as their
// keys say, but for those remembered already (which take the newer
// revision), those whose last dead letter is GiveUpAfter old (given up,
// their keys noted for purging) and those beyond the bound (left).
func TestAdopt(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	r := newResync(2, 10)
	r.push("alice", &remembered{rev: 5, since: now})
	added, gaveUp, over := r.adopt([]keptUser{
		{user: "alice", rev: 7, since: now.Add(-time.Minute)},
		{user: "bob", rev: 3, since: now.Add(-time.Hour)},
		{user: "carol", rev: 4, since: now.Add(-time.Minute)},
		{user: "dave", rev: 6, since: now.Add(-time.Minute)},
	}, now, time.Hour)
	if added != 1 || !slices.Equal(gaveUp, []string{"bob@3"}) || !slices.Equal(over, []string{"dave@6"}) {
		t.Errorf("added %d, gave up %v, over %v; want 1, [bob@3], [dave@6]", added, gaveUp, over)
	}
	if a := r.users["alice"]; a.rev != 7 || !a.stored || !a.since.Equal(now) {
		t.Errorf("alice %+v: want revision 7, stored, since as this process had it", *a)
	}
	if c := r.users["carol"]; c == nil || c.rev != 4 || !c.stored || !c.since.Equal(now.Add(-time.Minute)) {
		t.Errorf("carol %+v: want remembered as her key says", c)
	}
	if !slices.Equal(r.gone, []string{"bob"}) {
		t.Errorf("keys to purge %v, want bob's", r.gone)
	}
	if got := r.take(10); !slices.Equal(got, []string{"alice", "carol"}) {
		t.Errorf("queue %v, want alice then carol", got)
	}
	if r.pending.Load() != 2 {
		t.Errorf("pending %d, want 2", r.pending.Load())
	}

	// An older revision in a key changes nothing of a user remembered.
	r.adopt([]keptUser{{user: "carol", rev: 2, since: now}}, now, time.Hour)
	if c := r.users["carol"]; c.rev != 4 {
		t.Errorf("carol at %d after an older key, want 4", c.rev)
	}
	// A stored user forgotten has their key purged; one never stored not.
	r.forget("carol")
	r.push("erin", &remembered{rev: 1, since: now})
	r.forget("erin")
	if !slices.Equal(r.gone, []string{"bob", "carol"}) {
		t.Errorf("keys to purge %v, want bob's and carol's", r.gone)
	}
}
