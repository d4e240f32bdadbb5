package authz

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/greendot/greendot/pkg/presence"
)

// counts returns how many follow edges and lists the graph was read for.
func (g *graph) counts() (edges, lists int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reads, g.lists
}

// users returns n user ids with prefix.
func users(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

// want returns whether each watcher may see each target's last_seen, by
// the rule (the user, everyone, nobody but the user, or the users the
// target follows), from what g holds.
func want(g *graph, pairs func(i int) (watcher, target string), n int) []bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]bool, n)
	for i := range out {
		w, t := pairs(i)
		switch g.settings[t].LastSeenVisibility() {
		case presence.Everyone:
			out[i] = true
		case presence.Contacts:
			out[i] = g.follows[[2]string{t, w}]
		}
		out[i] = out[i] || w == t
	}
	return out
}

// checkReads checks that decide returns what want says of the n pairs
// that pair gives, and reads edges follow edges and lists lists of g.
func checkReads(t *testing.T, g *graph, step string, decide func() []bool, pair func(i int) (watcher, target string), n, edges, lists int) {
	t.Helper()
	e0, l0 := g.counts()
	got := decide()
	e1, l1 := g.counts()
	if exp := want(g, pair, n); !slices.Equal(got, exp) {
		t.Errorf("%s: got %v, want %v", step, got, exp)
	}
	if e, l := e1-e0, l1-l0; e != edges || l != lists {
		t.Errorf("%s: read %d edges and %d lists, want %d and %d", step, e, l, edges, lists)
	}
}

// TestLastSeenTo: what many watchers may see of one target's last_seen is
// what the rule says of each, under each setting, with the target's
// settings read once and an edge read per watcher only under the contacts
// setting, none while cached, and again once the graph changes.
func TestLastSeenTo(t *testing.T) {
	ctx := context.Background()
	g := newGraph()
	watchers := append(users("w", 30), "target", "w00") // the target itself may watch, and a user twice
	for _, w := range watchers[:10] {
		g.set("target", w, true)
	}
	g.set("w20", "target", true) // the other way: not a contact
	r := newRig(Everyone, g)
	check := func(step string, edges int) {
		t.Helper()
		checkReads(t, g, step, func() []bool { return r.a.LastSeenTo(ctx, "target", watchers) },
			func(i int) (string, string) { return watchers[i], "target" }, len(watchers), edges, 0)
	}
	check("contacts", 30)
	check("contacts, cached", 0)
	g.set("target", "w15", true)
	r.a.Changed(ctx, presence.FollowKey("target", "w15"))
	check("a new contact", 1)

	for _, v := range []presence.Visibility{presence.Nobody, presence.Everyone, presence.Contacts} {
		g.mu.Lock()
		g.settings["target"] = presence.Settings{LastSeen: v}
		g.mu.Unlock()
		r.a.Changed(ctx, presence.SettingsKey("target"))
		check("setting "+string(v), 0) // the edges are still cached
	}
	r.a = newRig(Everyone, g).a // nothing cached
	g.mu.Lock()
	g.settings["target"] = presence.Settings{LastSeen: presence.Nobody}
	g.mu.Unlock()
	check("nobody: no edge read", 0)

	r.a = newRig(Everyone, g).a
	g.setDown(true)
	got := r.a.LastSeenTo(ctx, "target", watchers)
	for i, w := range watchers {
		if got[i] != (w == "target") {
			t.Errorf("graph down: %s shown %v; want hidden but from the target", w, got[i])
		}
	}
}

// TestLastSeenOf: what one watcher may see of many targets' last_seen is
// what the rule says of each, with an edge read only for the targets that
// show it to their contacts, and none while cached.
func TestLastSeenOf(t *testing.T) {
	ctx := context.Background()
	g := newGraph()
	many := append(users("t", 40), "watcher")
	for i, u := range many[:40] {
		switch i % 4 {
		case 0:
			g.settings[u] = presence.Settings{LastSeen: presence.Everyone}
		case 1:
			g.settings[u] = presence.Settings{LastSeen: presence.Nobody}
		}
		if i%3 == 0 {
			g.set(u, "watcher", true)
		}
	}
	r := newRig(Everyone, g)
	check := func(step string, targets []string, edges, lists int) {
		t.Helper()
		checkReads(t, g, step, func() []bool { return r.a.LastSeenOf(ctx, "watcher", targets) },
			func(i int) (string, string) { return "watcher", targets[i] }, len(targets), edges, lists)
	}
	check("a few targets", []string{"t00", "t01", "t02", "t03"}, 2, 0) // t02 and t03 show last_seen to their contacts
	// 20 of the 40 show last_seen to their contacts, 2 of them cached.
	check("many targets", many, 18, 0)
	check("many targets, cached", many, 0, 0)

	r.a = newRig(Everyone, g).a // nothing cached
	g.setDown(true)
	got := r.a.LastSeenOf(ctx, "watcher", many)
	for i, u := range many {
		if got[i] != (u == "watcher") {
			t.Errorf("graph down: %s shown %v; want hidden but the watcher's own", u, got[i])
		}
	}
}
