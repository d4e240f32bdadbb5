package authz

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/greendot/greendot/gateway/internal/hub"
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
// what the rule says of each, under each setting, with one read of
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
		checkReads(t, g, step, func() []bool { return r.a.LastSeenTo(ctx, "target", watchers) },
			func(i int) (string, string) { return watchers[i], "target" }, len(watchers), edges, lists)
	}
	g.set("target", "x2", true)
	check("contacts, a few watchers", []string{"x1", "x2", "x3", "target"}, 3, 0)
	check("contacts, a few, cached", []string{"x1", "x2", "x3", "target"}, 0, 0)
	check("contacts, many watchers", many, 0, 1)
	check("contacts, many, cached", many, 0, 0)
	g.set("target", "y2", true)
	r.a.Changed(ctx, presence.FollowKey("target", "y2"))
	// The list read again answers a few watchers as well.
	check("contacts, many, after a change", many, 0, 1)
	check("contacts, a few, from the list", []string{"y1", "y2", "target"}, 0, 0)

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
	// 20 of the 40 show last_seen to their contacts, 2 of them cached;
	// the edges to the watcher are read one by one (its followers are
	// never listed).
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

// TestSettingsChangeReadsLists: a change of a target's settings re-checks
// the subscriptions of its watchers; for more than listAbove of them
// whether the target follows each comes from the list of its follows,
// read once, and each watcher whose view of last_seen changed is shown
// the target again.
func TestSettingsChangeReadsLists(t *testing.T) {
	for _, tc := range []struct {
		policy Policy
		edges  int // read one by one: whether each watcher follows the target
	}{
		{Everyone, 0},
		{Mutual, 20},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			ctx := context.Background()
			g := newGraph()
			r := newRig(tc.policy, g)
			var socks []*sock
			for _, u := range users("w", 20) {
				g.set("target", u, true)
				g.set(u, "target", true)
				s := r.sock(u)
				socks = append(socks, s)
				// Registered as Subscribe would, without its reads.
				if _, err := r.h.Add(s, []hub.Grant{{User: "target", LastSeen: true}}); err != nil {
					t.Fatal(err)
				}
			}
			g.mu.Lock()
			g.settings["target"] = presence.Settings{LastSeen: presence.Nobody}
			g.mu.Unlock()
			e0, l0 := g.counts()
			r.a.Changed(ctx, presence.SettingsKey("target"))
			e1, l1 := g.counts()
			if e, l := e1-e0, l1-l0; e != tc.edges || l != 1 {
				t.Errorf("read %d edges and %d lists, want %d and 1", e, l, tc.edges)
			}
			r.n.mu.Lock()
			reshown := slices.Sorted(slices.Values(r.n.reshown))
			r.n.mu.Unlock()
			var want []string
			for _, s := range socks {
				want = append(want, s.user+"->target")
				if !r.h.Watching(s, "target") {
					t.Errorf("%s no longer watches the target", s.user)
				}
			}
			if !slices.Equal(reshown, want) {
				t.Errorf("shown again %v, want %v", reshown, want)
			}
		})
	}
}

// TestLongListGivenUp: a target who follows far more users than the
// watchers whose edges a decision needs has its list given up once it
// grows past listFactor times them, and the edges read one by one.
func TestLongListGivenUp(t *testing.T) {
	ctx := context.Background()
	g := newGraph()
	for _, u := range users("f", 1000) {
		g.set("star", u, true)
	}
	watchers := users("w", 20)
	g.set("star", "w03", true)
	r := newRig(Everyone, g)
	checkReads(t, g, "a list too long", func() []bool { return r.a.LastSeenTo(ctx, "star", watchers) },
		func(i int) (string, string) { return watchers[i], "star" }, len(watchers), 20, 1)
	checkReads(t, g, "the edges cached", func() []bool { return r.a.LastSeenTo(ctx, "star", watchers) },
		func(i int) (string, string) { return watchers[i], "star" }, len(watchers), 0, 0)
	// Enough watchers for the list: it is read, and cached.
	many := users("f", 200)
	checkReads(t, g, "a list short enough", func() []bool { return r.a.LastSeenTo(ctx, "star", many) },
		func(i int) (string, string) { return many[i], "star" }, len(many), 0, 1)
	checkReads(t, g, "the list cached", func() []bool { return r.a.LastSeenTo(ctx, "star", many) },
		func(i int) (string, string) { return many[i], "star" }, len(many), 0, 0)
}

// TestSubscribeReadsFollowsAsList: a subscription to many targets under
// the mutual policy reads whether the watcher follows each from the list
// of its follows, read once, and whether each follows the watcher one by
// one.
func TestSubscribeReadsFollowsAsList(t *testing.T) {
	ctx := context.Background()
	g := newGraph()
	targets := users("t", 30)
	for i, u := range targets {
		g.set("alice", u, i%3 != 0) // alice follows two thirds of them
		g.set(u, "alice", true)
	}
	r := newRig(Mutual, g)
	alice := r.sock("alice")
	e0, l0 := g.counts()
	grants, denied, _, err := r.a.Subscribe(ctx, alice, targets)
	if err != nil {
		t.Fatal(err)
	}
	e1, l1 := g.counts()
	if len(grants) != 20 || len(denied) != 10 {
		t.Errorf("granted %d and denied %d, want 20 and 10", len(grants), len(denied))
	}
	if e, l := e1-e0, l1-l0; e != 30 || l != 1 {
		t.Errorf("read %d edges and %d lists, want 30 and 1", e, l)
	}
}
