package authz

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// graph is an in-memory Graph. While down, its reads fail, as they do
// while NATS is slow or away.
type graph struct {
	mu            sync.Mutex
	follows       map[[2]string]bool
	settings      map[string]presence.Settings
	reads         int // of follow edges
	lists         int // of follows or followers
	settingsReads int
	// latency, while set, is how long a read of settings takes (in a
	// synctest bubble, virtual time).
	latency time.Duration
	down    bool
}

var errGraphDown = errors.New("nats: timeout")

func newGraph(edges ...[2]string) *graph {
	g := &graph{follows: make(map[[2]string]bool), settings: make(map[string]presence.Settings)}
	for _, e := range edges {
		g.follows[e] = true
	}
	return g
}

func (g *graph) Follows(_ context.Context, a, b string) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reads++
	if g.down {
		return false, errGraphDown
	}
	return g.follows[[2]string{a, b}], nil
}

func (g *graph) FollowingAtMost(_ context.Context, a string, max int) ([]string, bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lists++
	if g.down {
		return nil, false, errGraphDown
	}
	var out []string
	for e, on := range g.follows {
		if e[0] == a && on {
			out = append(out, e[1])
		}
	}
	slices.Sort(out)
	if max > 0 && len(out) > max {
		return out[:max], false, nil
	}
	return out, true, nil
}

func (g *graph) Settings(_ context.Context, u string) (presence.Settings, error) {
	g.mu.Lock()
	g.settingsReads++
	latency := g.latency
	g.mu.Unlock()
	time.Sleep(latency)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.down {
		return presence.Settings{}, errGraphDown
	}
	return g.settings[u], nil
}

// setDown has the graph's reads fail (down) or succeed again.
func (g *graph) setDown(down bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = down
}

// readCount returns how many follow edges were read.
func (g *graph) readCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reads
}

func (g *graph) set(a, b string, on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.follows[[2]string{a, b}] = on
}

// sock is a hub.Watcher of a user.
type sock struct{ user string }

func (s *sock) UserID() string                   { return s.user }
func (s *sock) Deliver(presence.Presence, int64) {}
func (s *sock) Closed() bool                     { return false }

// notes records what the authorizer tells sockets.
type notes struct {
	mu      sync.Mutex
	revoked []string
	reshown []string
	calls   int // of Reshow
}

func (n *notes) Revoked(w hub.Watcher, user, reason string) {
	n.mu.Lock()
	n.revoked = append(n.revoked, w.UserID()+"->"+user+":"+reason)
	n.mu.Unlock()
}

func (n *notes) Reshow(user string, ws []hub.Watcher) {
	n.mu.Lock()
	n.calls++
	for _, w := range ws {
		n.reshown = append(n.reshown, w.UserID()+"->"+user)
	}
	n.mu.Unlock()
}

type rig struct {
	a     *Authorizer
	g     *graph
	h     *hub.Hub
	n     *notes
	socks map[string][]hub.Watcher
}

func newRig(p Policy, g *graph) *rig {
	r := &rig{g: g, h: hub.New(nil), n: &notes{}, socks: make(map[string][]hub.Watcher)}
	r.a = New(Config{
		Policy: p, Graph: g, CacheTTL: time.Hour, Hub: r.h, Notify: r.n,
		SocketsOf: func(u string) []hub.Watcher { return r.socks[u] },
	})
	return r
}

func (r *rig) sock(user string) *sock {
	s := &sock{user}
	r.socks[user] = append(r.socks[user], s)
	return s
}

func TestPolicies(t *testing.T) {
	g := newGraph([2]string{"alice", "bob"}, [2]string{"bob", "alice"}, [2]string{"alice", "carol"})
	g.settings["bob"] = presence.Settings{LastSeen: presence.Nobody}
	for _, tt := range []struct {
		policy          Policy
		watcher, target string
		want            Decision
	}{
		{Mutual, "alice", "bob", Decision{Allowed: true}},
		{Mutual, "alice", "carol", Decision{Reason: protocol.ReasonNotMutualFollowers}},
		{Mutual, "carol", "alice", Decision{Reason: protocol.ReasonNotMutualFollowers}},
		{Mutual, "alice", "alice", Decision{Allowed: true, LastSeen: true}},
		{Follow, "alice", "carol", Decision{Allowed: true}},
		{Follow, "carol", "alice", Decision{Reason: protocol.ReasonNotFollowing}},
		{Everyone, "carol", "alice", Decision{Allowed: true, LastSeen: true}},
		{Everyone, "dave", "carol", Decision{Allowed: true}},
	} {
		t.Run(string(tt.policy)+"/"+tt.watcher+"->"+tt.target, func(t *testing.T) {
			got, err := newRig(tt.policy, g).a.Decide(context.Background(), tt.watcher, tt.target)
			if err != nil || got != tt.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// TestUnfollowBetweenDecideAndRegister: a graph change that lands after a
// subscription was decided but before it was registered is not lost.
func TestUnfollowBetweenDecideAndRegister(t *testing.T) {
	ctx := context.Background()
	r := newRig(Mutual, newGraph([2]string{"alice", "bob"}, [2]string{"bob", "alice"}, [2]string{"alice", "carol"}, [2]string{"carol", "alice"}))
	alice := r.sock("alice")
	once := true
	r.a.ForTest().AfterDecide(func() {
		if once {
			once = false
			r.g.set("bob", "alice", false)
			r.a.Changed(ctx, presence.FollowKey("bob", "alice"))
		}
	})
	grants, denied, _, err := r.a.Subscribe(ctx, alice, []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []hub.Grant{{User: "carol", LastSeen: true}}; !slices.Equal(grants, want) {
		t.Errorf("granted %v, want %v", grants, want)
	}
	if want := []Denial{{"bob", protocol.ReasonNotMutualFollowers}}; !slices.Equal(denied, want) {
		t.Errorf("denied %v, want %v", denied, want)
	}
	if r.h.Watching(alice, "bob") {
		t.Error("alice watches bob, who stopped following her before she was registered")
	}
}

// TestChangeAfterRegisterRechecks: a graph change after the registration
// ends or changes the subscriptions it touches, and only those.
func TestChangeAfterRegisterRechecks(t *testing.T) {
	ctx := context.Background()
	g := newGraph([2]string{"alice", "bob"}, [2]string{"bob", "alice"}, [2]string{"carol", "bob"}, [2]string{"bob", "carol"})
	r := newRig(Mutual, g)
	alice, carol := r.sock("alice"), r.sock("carol")
	for _, w := range []*sock{alice, carol} {
		if _, _, _, err := r.a.Subscribe(ctx, w, []string{"bob"}); err != nil {
			t.Fatal(err)
		}
	}
	g.set("bob", "alice", false)
	r.a.Changed(ctx, presence.FollowKey("bob", "alice"))
	if r.h.Watching(alice, "bob") || !r.h.Watching(carol, "bob") {
		t.Errorf("after bob unfollowed alice: alice watches bob %v (want false), carol %v (want true)",
			r.h.Watching(alice, "bob"), r.h.Watching(carol, "bob"))
	}
	if want := []string{"alice->bob:" + protocol.ReasonNotMutualFollowers}; !slices.Equal(r.n.revoked, want) {
		t.Errorf("revoked %v, want %v", r.n.revoked, want)
	}
	// bob hides his last_seen: carol is shown bob again, without it.
	g.mu.Lock()
	g.settings["bob"] = presence.Settings{LastSeen: presence.Nobody}
	g.mu.Unlock()
	r.a.Changed(ctx, presence.SettingsKey("bob"))
	if want := []string{"carol->bob"}; !slices.Equal(r.n.reshown, want) {
		t.Errorf("reshown %v, want %v", r.n.reshown, want)
	}
}

// TestSettingsChangeShowsOnce: a change of a user's settings re-checks
// every subscription to the user, with the settings read once, and the
// sockets whose view of last_seen changed are shown the user in one
// call, which reads the user's presence once for them all.
func TestSettingsChangeShowsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g := newGraph()
		g.settings["bob"] = presence.Settings{LastSeen: presence.Everyone}
		r := newRig(Follow, g)
		var want []string
		for i := range 40 {
			u := fmt.Sprintf("w%02d", i)
			g.set(u, "bob", true)
			if i%2 == 0 {
				g.set("bob", u, true) // a contact: keeps seeing last_seen
			} else {
				want = append(want, u+"->bob")
			}
			if _, _, _, err := r.a.Subscribe(ctx, r.sock(u), []string{"bob"}); err != nil {
				t.Fatal(err)
			}
		}
		g.mu.Lock()
		g.settings["bob"] = presence.Settings{LastSeen: presence.Contacts}
		g.settingsReads = 0
		g.latency = time.Millisecond // the re-checks overlap it
		g.mu.Unlock()
		r.a.Changed(ctx, presence.SettingsKey("bob"))
		slices.Sort(r.n.reshown)
		if !slices.Equal(r.n.reshown, want) {
			t.Errorf("reshown %v, want %v", r.n.reshown, want)
		}
		if r.n.calls != 1 {
			t.Errorf("Reshow called %d times, want once for the change", r.n.calls)
		}
		if g.settingsReads != 1 {
			t.Errorf("settings read %d times, want once", g.settingsReads)
		}
		if len(r.n.revoked) != 0 {
			t.Errorf("revoked %v, want none", r.n.revoked)
		}
	})
}

// TestCacheIsDroppedByChanges: what a change drops is read again, and a
// read that began before a change is not cached.
func TestCacheIsDroppedByChanges(t *testing.T) {
	ctx := context.Background()
	g := newGraph([2]string{"alice", "bob"}, [2]string{"bob", "alice"})
	r := newRig(Mutual, g)
	for range 3 {
		if d, _ := r.a.Decide(ctx, "alice", "bob"); !d.Allowed {
			t.Fatal("alice may not watch bob")
		}
	}
	if g.reads != 2 {
		t.Errorf("%d graph reads for three decisions, want 2 (then cached)", g.reads)
	}
	g.set("alice", "bob", false)
	r.a.Changed(ctx, presence.FollowKey("alice", "bob"))
	if d, _ := r.a.Decide(ctx, "alice", "bob"); d.Allowed {
		t.Error("alice may still watch bob after she unfollowed him")
	}
}

func TestFriends(t *testing.T) {
	g := newGraph([2]string{"alice", "bob"}, [2]string{"bob", "alice"}, [2]string{"alice", "carol"}, [2]string{"alice", "dave"}, [2]string{"dave", "alice"})
	g.settings["dave"] = presence.Settings{LastSeen: presence.Nobody}
	got, err := newRig(Mutual, g).a.Friends(context.Background(), "alice", 100)
	if err != nil {
		t.Fatal(err)
	}
	if want := []hub.Grant{{User: "bob", LastSeen: true}, {User: "dave"}}; !slices.Equal(got, want) {
		t.Errorf("friends %v, want %v", got, want)
	}
}

// aliceWatchesBob returns a graph of alice and bob following each other,
// and a rig under the mutual policy in which alice watches bob.
func aliceWatchesBob(t *testing.T) (*graph, *rig, *sock) {
	t.Helper()
	g := newGraph([2]string{"alice", "bob"}, [2]string{"bob", "alice"})
	r := newRig(Mutual, g)
	alice := r.sock("alice")
	if _, _, _, err := r.a.Subscribe(context.Background(), alice, []string{"bob"}); err != nil {
		t.Fatal(err)
	}
	return g, r, alice
}

// TestFailedRecheckIsTriedAgain: a re-check whose read of the graph fails
// (NATS slow or away) is not dropped: it is tried again until it decides,
// so an unfollow still ends the subscription it no longer allows.
func TestFailedRecheckIsTriedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g, r, alice := aliceWatchesBob(t)
		g.set("bob", "alice", false)
		g.setDown(true)
		r.a.Changed(ctx, presence.FollowKey("bob", "alice"))
		// A minute without NATS: tried again and again, nothing decided.
		reads := g.readCount()
		time.Sleep(time.Minute)
		synctest.Wait()
		if g.readCount() == reads {
			t.Error("the failed re-check was not tried again")
		}
		if !r.h.Watching(alice, "bob") || len(r.n.revoked) != 0 {
			t.Fatalf("decided without reading the graph: watching %v, revoked %v", r.h.Watching(alice, "bob"), r.n.revoked)
		}
		g.setDown(false)
		time.Sleep(retryMax)
		synctest.Wait()
		if r.h.Watching(alice, "bob") {
			t.Error("alice still watches bob, who stopped following her while the graph could not be read")
		}
		if want := []string{"alice->bob:" + protocol.ReasonNotMutualFollowers}; !slices.Equal(r.n.revoked, want) {
			t.Errorf("revoked %v, want %v", r.n.revoked, want)
		}
	})
}

// TestRecheckRetriesEndWithTheSubscription: a re-check tried again is
// given up once the subscription it is about ends (an unsubscribe, a
// closed socket): nothing is left to decide.
func TestRecheckRetriesEndWithTheSubscription(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g, r, alice := aliceWatchesBob(t)
		g.setDown(true)
		defer g.setDown(false) // lets a retry that would not give up end
		r.a.Changed(ctx, presence.FollowKey("bob", "alice"))
		r.h.Remove(alice, []string{"bob"})
		time.Sleep(retryMax)
		synctest.Wait()
		reads := g.readCount()
		time.Sleep(time.Minute)
		synctest.Wait()
		if g.readCount() != reads {
			t.Errorf("%d reads in a minute after the subscription ended, want none", g.readCount()-reads)
		}
		if len(r.n.revoked) != 0 {
			t.Errorf("revoked %v, want nothing (alice unsubscribed herself)", r.n.revoked)
		}
	})
}

// TestCloseEndsRetries: Close ends the goroutine that tries failed
// re-checks again, and returns once it has: with the graph down for good,
// nothing is read after it, and nothing is left running (synctest's
// bubble would not end).
func TestCloseEndsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		g, r, _ := aliceWatchesBob(t)
		g.setDown(true)
		r.a.Changed(ctx, presence.FollowKey("bob", "alice"))
		time.Sleep(retryMax)
		synctest.Wait()
		if g.readCount() < 2 {
			t.Fatalf("%d reads while the graph is down, want the re-check tried again", g.readCount())
		}
		r.a.Close()
		reads := g.readCount()
		time.Sleep(time.Minute)
		synctest.Wait()
		if g.readCount() != reads {
			t.Errorf("%d reads in a minute after Close, want none", g.readCount()-reads)
		}
	})
}
