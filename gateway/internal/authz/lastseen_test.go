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

// want returns what ShowLastSeen says of each pair, asked one by one of
// an authorizer of its own over the same graph.
func want(g *graph, pairs func(i int) (watcher, target string), n int) []bool {
	a := newRig(Everyone, g).a
	out := make([]bool, n)
	for i := range out {
		w, t := pairs(i)
		out[i] = a.ShowLastSeen(context.Background(), w, t)
	}
	return out
}

// TestLastSeenTo: what many watchers may see of one target's last_seen is
// what ShowLastSeen says of each, under each setting, with one read of
// the target's follows for many watchers, the edges one by one for a few,
// none while cached, and again once the graph changes.
func TestLastSeenTo(t *testing.T) {
	ctx := context.Background()
	g := newGraph()
	many := append(users("w", 30), "target") // the target itself may watch
	for _, w := range many[:10] {
		g.set("target", w, true)
	}
	g.set("w20", "target", true) // the other way: not a contact
	r := newRig(Everyone, g)
	check := func(step string, watchers []string, edges, lists int) {
		t.Helper()
		e0, l0 := g.counts()
		got := r.a.LastSeenTo(ctx, "target", watchers)
		exp := want(g, func(i int) (string, string) { return watchers[i], "target" }, len(watchers))
		e1, l1 := g.counts()
		if !slices.Equal(got, exp) {
			t.Errorf("%s: got %v, want %v", step, got, exp)
		}
		// want's reads are its own authorizer's: take them off.
		if e, l := e1-e0-(len(watchers)-1), l1-l0; e != edges || l != lists {
			t.Errorf("%s: read %d edges and %d lists, want %d and %d", step, e, l, edges, lists)
		}
	}
	check("contacts, many watchers", many, 0, 1)
	check("contacts, cached", many, 0, 0)
	few := []string{"x1", "x2", "x3", "target"}
	g.set("target", "x2", true)
	check("contacts, a few watchers", few, 3, 0)
	check("contacts, a few, cached", few, 0, 0)

	g.set("target", "w15", true)
	r.a.Changed(ctx, presence.FollowKey("target", "w15"))
	check("a new contact", many, 0, 1)

	for _, v := range []presence.Visibility{presence.Nobody, presence.Everyone, presence.Contacts} {
		g.mu.Lock()
		g.settings["target"] = presence.Settings{LastSeen: v}
		g.mu.Unlock()
		r.a.Changed(ctx, presence.SettingsKey("target"))
		check("setting "+string(v), many, 0, 0) // the list is still cached
	}

	r.a = newRig(Everyone, g).a // nothing cached
	g.setDown(true)
	got := r.a.LastSeenTo(ctx, "target", many)
	for i, w := range many {
		if got[i] != (w == "target") {
			t.Errorf("graph down: %s shown %v; want hidden but from the target", w, got[i])
		}
	}
}

// TestLastSeenOf: what one watcher may see of many targets' last_seen is
// what ShowLastSeen says of each, with one read of the watcher's
// followers for many targets that show it to their contacts, and the
// edges one by one for a few.
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
		e0, l0 := g.counts()
		got := r.a.LastSeenOf(ctx, "watcher", targets)
		e1, l1 := g.counts()
		exp := want(g, func(i int) (string, string) { return "watcher", targets[i] }, len(targets))
		if !slices.Equal(got, exp) {
			t.Errorf("%s: got %v, want %v", step, got, exp)
		}
		if e, l := e1-e0, l1-l0; e != edges || l != lists {
			t.Errorf("%s: read %d edges and %d lists, want %d and %d", step, e, l, edges, lists)
		}
	}
	// 20 of the 40 show last_seen to their contacts: more than listAbove.
	check("many targets", many, 0, 1)
	check("many targets, cached", many, 0, 0)
	check("a few targets", []string{"t42", "t43", "t44"}, 3, 0)

	r.a = newRig(Everyone, g).a // nothing cached
	g.setDown(true)
	got := r.a.LastSeenOf(ctx, "watcher", many)
	for i, u := range many {
		if got[i] != (u == "watcher") {
			t.Errorf("graph down: %s shown %v; want hidden but the watcher's own", u, got[i])
		}
	}
}
