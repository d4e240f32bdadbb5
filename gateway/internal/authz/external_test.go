package authz

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// appAnswers is an in-memory AppSource: the app's answers, and the
// questions it was asked.
type appAnswers struct {
	mu      sync.Mutex
	allowed map[[2]string]bool
	asked   [][]string
	down    bool
}

func (p *appAnswers) Allowed(_ context.Context, watcher string, targets []string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, slices.Clone(targets))
	if p.down {
		return nil, errors.New("no answer")
	}
	var out []string
	for _, t := range targets {
		if p.allowed[[2]string{watcher, t}] {
			out = append(out, t)
		}
	}
	return out, nil
}

func (p *appAnswers) List(_ context.Context, watcher string, max int) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return nil, errors.New("no answer")
	}
	var out []string
	for k, on := range p.allowed {
		if on && k[0] == watcher && len(out) < max {
			out = append(out, k[1])
		}
	}
	slices.Sort(out)
	return out, nil
}

func (p *appAnswers) set(w, t string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.allowed[[2]string{w, t}] = on
}

func newAppRig(g *graph, app AppSource) *rig {
	r := &rig{g: g, h: hub.New(nil), n: &notes{}, socks: make(map[string][]hub.Watcher)}
	r.a = New(Config{
		Policy: App, Graph: g, CacheTTL: time.Hour, Hub: r.h, Notify: r.n,
		SocketsOf: func(u string) []hub.Watcher { return r.socks[u] },
		App:       app, AppCacheTTL: time.Hour,
	})
	return r
}

// listSock is a socket whose token carries a watch list.
type listSock struct {
	sock
	list *WatchList
}

func (s *listSock) WatchList() *WatchList { return s.list }

func TestTokenPolicy(t *testing.T) {
	g := newGraph() // no follow edge: the list alone decides
	g.settings["carol"] = presence.Settings{LastSeen: presence.Nobody}
	r := newRig(Token, g)
	alice := &listSock{sock{"alice"}, NewWatchList([]string{"bob", "carol", "bob"})}
	ctx := context.Background()
	grants, denied, _, err := r.a.Subscribe(ctx, alice, []string{"bob", "carol", "dave", "alice"})
	if err != nil {
		t.Fatal(err)
	}
	want := []hub.Grant{{User: "bob", LastSeen: true}, {User: "carol"}, {User: "alice", LastSeen: true}}
	if !slices.Equal(grants, want) {
		t.Errorf("granted %v, want %v", grants, want)
	}
	if want := []Denial{{"dave", protocol.ReasonNotAllowed}}; !slices.Equal(denied, want) {
		t.Errorf("denied %v, want %v", denied, want)
	}
	// The HTTP API's list comes in the context.
	hctx := WithWatchList(ctx, alice.list)
	if d, _ := r.a.Decide(hctx, "alice", "bob"); !d.Allowed {
		t.Error("Decide with the list: bob not allowed")
	}
	if d, _ := r.a.Decide(ctx, "alice", "bob"); d.Allowed {
		t.Error("Decide without a list allowed bob")
	}
	friends, err := r.a.Friends(hctx, "alice", 1)
	if err != nil || len(friends) != 1 || friends[0].User != "bob" {
		t.Errorf("friends (max 1) = %v, %v; want bob", friends, err)
	}
	// A refresh replaces the list: bob's subscription ends.
	alice.list = NewWatchList([]string{"carol"})
	r.a.Recheck(ctx, alice)
	if r.h.Watching(alice, "bob") || !r.h.Watching(alice, "carol") {
		t.Errorf("after the refresh: bob %v (want false), carol %v (want true)", r.h.Watching(alice, "bob"), r.h.Watching(alice, "carol"))
	}
	if want := []string{"alice->bob:" + protocol.ReasonNotAllowed}; !slices.Equal(r.n.revoked, want) {
		t.Errorf("revoked %v, want %v", r.n.revoked, want)
	}
	// Follow edges are not this policy's business.
	g.set("alice", "carol", true)
	r.a.Changed(ctx, presence.FollowKey("alice", "carol"))
	if !r.h.Watching(alice, "carol") {
		t.Error("a follow edge changed a token decision")
	}
}

func TestAppPolicyBatchesAndCaches(t *testing.T) {
	ctx := context.Background()
	app := &appAnswers{allowed: map[[2]string]bool{{"alice", "bob"}: true}}
	r := newAppRig(newGraph(), app)
	alice := r.sock("alice")
	grants, denied, _, err := r.a.Subscribe(ctx, alice, []string{"bob", "carol", "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if len(grants) != 2 || len(denied) != 1 || denied[0].Reason != protocol.ReasonNotAllowed {
		t.Errorf("granted %v, denied %v", grants, denied)
	}
	if want := [][]string{{"bob", "carol"}}; !slices.EqualFunc(app.asked, want, slices.Equal) {
		t.Errorf("asked %v, want one question %v", app.asked, want)
	}
	// Cached: nothing is asked again, even with the app down.
	app.down = true
	if ds, err := r.a.DecideAll(ctx, "alice", []string{"bob", "carol"}); err != nil || !ds[0].Allowed || ds[1].Allowed {
		t.Errorf("cached decisions %v, %v", ds, err)
	}
	// Not cached, and the app down: refused as unavailable, not cached.
	if d, _ := r.a.Decide(ctx, "alice", "dave"); d.Allowed || d.Reason != protocol.ReasonAuthorizationUnavailable {
		t.Errorf("dave with the app down: %+v", d)
	}
	if _, err := r.a.Friends(ctx, "alice", 10); !errors.Is(err, ErrAppUnavailable) {
		t.Errorf("friends with the app down: %v, want ErrAppUnavailable", err)
	}
	app.down = false
	app.set("alice", "dave", true)
	if d, _ := r.a.Decide(ctx, "alice", "dave"); !d.Allowed {
		t.Errorf("dave once the app answers: %+v", d)
	}
}

func TestAppInvalidation(t *testing.T) {
	ctx := context.Background()
	app := &appAnswers{allowed: map[[2]string]bool{{"alice", "bob"}: true, {"alice", "carol"}: true, {"dave", "bob"}: true}}
	r := newAppRig(newGraph(), app)
	alice, dave := r.sock("alice"), r.sock("dave")
	for _, s := range []struct {
		w       hub.Watcher
		targets []string
	}{{alice, []string{"bob", "carol"}}, {dave, []string{"bob"}}} {
		if _, _, _, err := r.a.Subscribe(ctx, s.w, s.targets); err != nil {
			t.Fatal(err)
		}
	}
	app.set("alice", "bob", false)
	app.set("alice", "carol", false)
	// Only alice->bob is dropped and re-decided: carol stays cached.
	r.a.Invalidate(ctx, "alice", "bob")
	if r.h.Watching(alice, "bob") || !r.h.Watching(alice, "carol") || !r.h.Watching(dave, "bob") {
		t.Errorf("after invalidating alice->bob: alice watches bob %v, carol %v; dave bob %v",
			r.h.Watching(alice, "bob"), r.h.Watching(alice, "carol"), r.h.Watching(dave, "bob"))
	}
	// Everything: carol goes too; dave keeps bob.
	r.a.Invalidate(ctx, "", "")
	if r.h.Watching(alice, "carol") || !r.h.Watching(dave, "bob") {
		t.Errorf("after invalidating all: alice watches carol %v, dave bob %v", r.h.Watching(alice, "carol"), r.h.Watching(dave, "bob"))
	}
	want := []string{"alice->bob:" + protocol.ReasonNotAllowed, "alice->carol:" + protocol.ReasonNotAllowed}
	if !slices.Equal(r.n.revoked, want) {
		t.Errorf("revoked %v, want %v", r.n.revoked, want)
	}
	// An invalidation that lands while a subscribe is decided has it
	// decided again before anything is registered.
	app.set("alice", "bob", true)
	once := true
	r.a.ForTest().AfterDecide(func() {
		if once {
			once = false
			app.set("alice", "bob", false)
			r.a.Invalidate(ctx, "", "bob")
		}
	})
	grants, _, _, err := r.a.Subscribe(ctx, alice, []string{"bob"})
	if err != nil || len(grants) != 0 || r.h.Watching(alice, "bob") {
		t.Errorf("subscribe across an invalidation granted %v (%v)", grants, err)
	}
}

// TestRecheckRefusesDespiteFailedSettingsRead: under the token and app
// policies, a re-check that cannot read a target's settings still ends at
// once the subscriptions no longer allowed, which need no such read; the
// others are tried again once the graph can be read.
func TestRecheckRefusesDespiteFailedSettingsRead(t *testing.T) {
	for _, tt := range []struct {
		policy Policy
		// revoke makes alice no longer allowed to watch bob, and has
		// her subscriptions re-checked.
		revoke func(r *rig, alice *listSock, app *appAnswers)
	}{
		{Token, func(r *rig, alice *listSock, _ *appAnswers) {
			alice.list = NewWatchList([]string{"carol"})
			r.a.Recheck(context.Background(), alice)
		}},
		{App, func(r *rig, _ *listSock, app *appAnswers) {
			app.set("alice", "bob", false)
			r.a.Invalidate(context.Background(), "alice", "")
		}},
	} {
		t.Run(string(tt.policy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGraph()
				app := &appAnswers{allowed: map[[2]string]bool{{"alice", "bob"}: true, {"alice", "carol"}: true}}
				r := newAppRig(g, app)
				r.a.cfg.Policy = tt.policy
				r.a.cfg.CacheTTL = 0 // every re-check reads the settings
				alice := &listSock{sock{"alice"}, NewWatchList([]string{"bob", "carol"})}
				r.socks["alice"] = []hub.Watcher{alice}
				if _, _, _, err := r.a.Subscribe(context.Background(), alice, []string{"bob", "carol"}); err != nil {
					t.Fatal(err)
				}
				g.setDown(true)
				tt.revoke(r, alice, app)
				if r.h.Watching(alice, "bob") || !r.h.Watching(alice, "carol") {
					t.Errorf("with the settings unreadable: alice watches bob %v (want false), carol %v (want true)",
						r.h.Watching(alice, "bob"), r.h.Watching(alice, "carol"))
				}
				want := []string{"alice->bob:" + protocol.ReasonNotAllowed}
				if !slices.Equal(r.n.revoked, want) {
					t.Errorf("revoked %v, want %v", r.n.revoked, want)
				}
				// carol's re-check is tried again, and keeps her.
				g.setDown(false)
				time.Sleep(retryMax)
				synctest.Wait()
				if !r.h.Watching(alice, "carol") || !slices.Equal(r.n.revoked, want) {
					t.Errorf("once the settings are read: alice watches carol %v (want true); revoked %v, want %v",
						r.h.Watching(alice, "carol"), r.n.revoked, want)
				}
			})
		})
	}
}

// slowList is an AppSource whose List answers what the app said when
// asked, but only once released: an answer still on its way.
type slowList struct {
	*appAnswers
	asked, release chan struct{}
}

func (s *slowList) List(ctx context.Context, watcher string, max int) ([]string, error) {
	out, err := s.appAnswers.List(ctx, watcher, max)
	close(s.asked)
	<-s.release
	return out, err
}

// TestAppFriendsListOlderThanInvalidationIsNotCached: a friends list the
// app answered before revoking a user, and that arrives after its
// invalidation, is not cached: the revoked user is not allowed for
// AppCacheTTL on the strength of it.
func TestAppFriendsListOlderThanInvalidationIsNotCached(t *testing.T) {
	ctx := context.Background()
	app := &appAnswers{allowed: map[[2]string]bool{{"alice", "bob"}: true}}
	list := &slowList{appAnswers: app, asked: make(chan struct{}), release: make(chan struct{})}
	r := newAppRig(newGraph(), list)
	done := make(chan error, 1)
	go func() {
		_, err := r.a.Friends(ctx, "alice", 50)
		done <- err
	}()
	await(t, list.asked, "the app was never asked for the friends list")
	app.set("alice", "bob", false)
	r.a.Invalidate(ctx, "alice", "bob")
	close(list.release)
	if err := await(t, done, "the friends list never came"); err != nil {
		t.Fatal(err)
	}
	if d, err := r.a.Decide(ctx, "alice", "bob"); err != nil || d.Allowed {
		t.Errorf("alice -> bob after the app revoked and invalidated it: %+v, %v; want refused", d, err)
	}
	// A list not overtaken by an invalidation is cached as before.
	app.set("alice", "carol", true)
	list.asked, list.release = make(chan struct{}), make(chan struct{})
	close(list.release)
	if _, err := r.a.Friends(ctx, "alice", 50); err != nil {
		t.Fatal(err)
	}
	app.down = true
	if d, _ := r.a.Decide(ctx, "alice", "carol"); !d.Allowed {
		t.Errorf("alice -> carol from the cached friends list: %+v", d)
	}
}

// await returns what ch gives, or fails the test if it gives nothing in
// a while.
func await[T any](t *testing.T, ch <-chan T, failure string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal(failure)
		panic("unreachable")
	}
}
