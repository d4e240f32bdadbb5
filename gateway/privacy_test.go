package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// presenceOf returns the presence of user in a presence_init or
// presence_batch frame.
func presenceOf(m protocol.ServerMessage, user string) (presence.Presence, bool) {
	list := m.Updates
	if m.Type == protocol.TypePresenceInit {
		list = m.Users
	}
	for _, p := range list {
		if p.UserID == user {
			return p, true
		}
	}
	return presence.Presence{}, false
}

// onlineList is the answer of GET /api/presence/online.
type onlineList struct {
	Count int                 `json:"count"`
	Users []presence.Presence `json:"users"`
}

// queryAnswer is the answer of POST /api/presence/query.
type queryAnswer struct {
	Users  []presence.Presence `json:"users"`
	Denied []struct {
		UserID string `json:"user_id"`
		Reason string `json:"reason"`
	} `json:"denied"`
}

// everyAPIView reads target's presence as watcher through every HTTP
// route that can show it: GET users/{id}, POST query, GET friends (when
// friends is set) and GET online (when online is set). It returns one
// presence per route, by route name, and fails the test if a route does
// not list target.
func everyAPIView(tb testing.TB, g *systest.Gateway, watcher, target string, friends, online bool) map[string]presence.Presence {
	tb.Helper()
	h := bearer(secLongToken(tb, watcher))
	out := map[string]presence.Presence{}
	var p presence.Presence
	if st := apiCall(tb, "GET", g.HTTP+"/api/presence/users/"+target, h, nil, &p); st != http.StatusOK {
		tb.Fatalf("GET users/%s as %s: %d", target, watcher, st)
	}
	out["GET users"] = p
	var q queryAnswer
	if st := apiCall(tb, "POST", g.HTTP+"/api/presence/query", h, map[string]any{"user_ids": []string{target}}, &q); st != http.StatusOK || len(q.Users) != 1 {
		tb.Fatalf("POST query [%s] as %s: %d %+v", target, watcher, st, q)
	}
	out["POST query"] = q.Users[0]
	if friends {
		var f struct{ Friends []presence.Presence }
		if st := apiCall(tb, "GET", g.HTTP+"/api/presence/friends", h, nil, &f); st != http.StatusOK {
			tb.Fatalf("GET friends as %s: %d", watcher, st)
		}
		found := false
		for _, x := range f.Friends {
			if x.UserID == target {
				out["GET friends"], found = x, true
			}
		}
		if !found {
			tb.Fatalf("GET friends as %s: %+v lacks %s", watcher, f.Friends, target)
		}
	}
	if online {
		var o onlineList
		if st := apiCall(tb, "GET", g.HTTP+"/api/presence/online", h, nil, &o); st != http.StatusOK {
			tb.Fatalf("GET online as %s: %d", watcher, st)
		}
		found := false
		for _, x := range o.Users {
			if x.UserID == target {
				out["GET online"], found = x, true
			}
		}
		if !found {
			tb.Fatalf("GET online as %s: %+v lacks %s", watcher, o, target)
		}
	}
	return out
}

// TestLastSeenVisibility checks, for each last_seen setting and each
// relation between watcher and target, that last_seen is shown or hidden
// alike in presence_init, presence_batch and every HTTP answer.
func TestLastSeenVisibility(t *testing.T) {
	t.Parallel()
	type tcase struct {
		name       string
		visibility presence.Visibility // "" leaves the default (contacts)
		// The follow edges: target follows watcher (the watcher is a
		// contact) and watcher follows target.
		contact, follows bool
		show             bool
	}
	policies := []struct {
		policy gateway.Policy
		cases  []tcase
	}{
		{gateway.PolicyMutual, []tcase{
			{"default is contacts", "", true, true, true},
			{"contacts", presence.Contacts, true, true, true},
			{"everyone", presence.Everyone, true, true, true},
			{"nobody", presence.Nobody, true, true, false},
		}},
		{gateway.PolicyFollow, []tcase{
			{"contacts, not a contact", presence.Contacts, false, true, false},
			{"default, not a contact", "", false, true, false},
			{"contacts, a contact", presence.Contacts, true, true, true},
			{"everyone, not a contact", presence.Everyone, false, true, true},
			{"nobody, a contact", presence.Nobody, true, true, false},
		}},
		{gateway.PolicyEveryone, []tcase{
			{"contacts, no edge", presence.Contacts, false, false, false},
			{"contacts, a contact", presence.Contacts, true, false, true},
			{"everyone, no edge", presence.Everyone, false, false, true},
			{"nobody, mutual", presence.Nobody, true, true, false},
		}},
	}
	for _, pol := range policies {
		t.Run(string(pol.policy), func(t *testing.T) {
			sys := secStart(t, systest.Options{Gateway: gateway.Config{Policy: pol.policy}})
			gw := sys.Gateway()
			ctx := context.Background()
			type run struct {
				tcase
				w, tg   string
				wc, tgc *client.Conn
				// gc is a second socket of the watcher, watching everyone
				// (everyone policy only).
				gc   *client.Conn
				stop func()
			}
			runs := make([]*run, len(pol.cases))
			for i, tc := range pol.cases {
				r := &run{tcase: tc, w: fmt.Sprintf("w%d", i), tg: fmt.Sprintf("t%d", i)}
				runs[i] = r
				if tc.contact {
					sys.Follow(r.tg, r.w)
				}
				if tc.follows {
					sys.Follow(r.w, r.tg)
				}
				if tc.visibility != "" {
					if err := sys.Store.SetSettings(ctx, r.tg, presence.Settings{LastSeen: tc.visibility}); err != nil {
						t.Fatal(err)
					}
				}
				r.tgc = secDial(t, gw, r.tg)
				r.stop = systest.KeepAlive(r.tgc, systest.Heartbeat)
				r.wc = secDial(t, gw, r.w)
				defer systest.KeepAlive(r.wc, systest.Heartbeat)()
				if pol.policy == gateway.PolicyEveryone {
					r.gc = secDial(t, gw, r.w, "global")
					defer systest.KeepAlive(r.gc, systest.Heartbeat)()
				}
			}
			check := func(r *run, where string, p presence.Presence, truth int64) {
				t.Helper()
				switch {
				case r.show && p.LastSeen != truth:
					t.Errorf("%s, %s: %+v, want last_seen %d", r.name, where, p, truth)
				case !r.show && p.LastSeen != 0:
					t.Errorf("%s, %s: %+v shows last_seen, want it hidden", r.name, where, p)
				}
			}
			truth := func(user string) int64 {
				t.Helper()
				rec, err := sys.StatusOf(user)
				if err != nil {
					t.Fatal(err)
				}
				if rec.LastSeen == 0 {
					t.Fatalf("%s has no last_seen: %+v", user, rec)
				}
				return rec.LastSeen
			}

			// Online targets: the snapshot and every HTTP answer.
			for _, r := range runs {
				if err := r.wc.Subscribe("s", r.tg); err != nil {
					t.Fatal(err)
				}
				init := systest.Await(t, r.wc, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool {
					return m.Type == protocol.TypePresenceInit && m.ID == "s"
				})
				p, ok := presenceOf(init, r.tg)
				if !ok || p.Status != presence.Online {
					t.Fatalf("%s: presence_init %+v, want %s online", r.name, init, r.tg)
				}
				check(r, "presence_init", p, truth(r.tg))
				if pol.policy == gateway.PolicyEveryone {
					natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
						var o onlineList
						apiCall(t, "GET", gw.HTTP+"/api/presence/online", bearer(secLongToken(t, r.w)), nil, &o)
						for _, x := range o.Users {
							if x.UserID == r.tg {
								return nil
							}
						}
						return fmt.Errorf("%s not in the online list %+v", r.tg, o)
					})
				}
				for where, p := range everyAPIView(t, gw, r.w, r.tg, r.contact && r.follows, pol.policy == gateway.PolicyEveryone) {
					check(r, where, p, truth(r.tg))
				}
				if r.gc != nil {
					if err := r.gc.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: "all", All: true}); err != nil {
						t.Fatal(err)
					}
					init := systest.Await(t, r.gc, systest.EventTimeout, "presence_init all", func(m protocol.ServerMessage) bool {
						return m.Type == protocol.TypePresenceInit && m.ID == "all"
					})
					p, ok := presenceOf(init, r.tg)
					if !ok {
						t.Fatalf("%s: global presence_init %+v lacks %s", r.name, init, r.tg)
					}
					check(r, "global presence_init", p, truth(r.tg))
				}
			}

			// The targets leave: the offline batch and every HTTP answer.
			for _, r := range runs {
				r.stop()
				if err := r.tgc.Close(); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range runs {
				p := systest.AwaitStatus(t, r.wc, r.tg, presence.Offline)
				check(r, "presence_batch", p, truth(r.tg))
				if r.gc != nil {
					p := systest.AwaitStatus(t, r.gc, r.tg, presence.Offline)
					check(r, "global presence_batch", p, truth(r.tg))
				}
				for where, p := range everyAPIView(t, gw, r.w, r.tg, r.contact && r.follows, false) {
					check(r, where, p, truth(r.tg))
				}
				// A new subscription's snapshot of the offline target.
				if err := r.wc.Subscribe("again", r.tg); err != nil {
					t.Fatal(err)
				}
				init := systest.Await(t, r.wc, systest.EventTimeout, "presence_init again", func(m protocol.ServerMessage) bool {
					return m.Type == protocol.TypePresenceInit && m.ID == "again"
				})
				p, _ = presenceOf(init, r.tg)
				check(r, "presence_init of an offline user", p, truth(r.tg))
			}
		})
	}
}

// TestLastSeenFollowsSettingChanges changes a target's privacy setting and
// follow edge while a watcher watches the target, one by one or (under
// the everyone policy) as one of everyone: the watcher is sent the
// target's presence again, with last_seen appearing or disappearing,
// within seconds, and the HTTP API agrees.
func TestLastSeenFollowsSettingChanges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy gateway.Policy
	}{
		{"one by one", gateway.PolicyFollow},
		{"everyone", gateway.PolicyEveryone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			everyone := tc.policy == gateway.PolicyEveryone
			sys := secStart(t, systest.Options{Gateway: gateway.Config{Policy: tc.policy}})
			gw := sys.Gateway()
			ctx := context.Background()
			sys.Mutual("watcher", "target")
			tgt := secDial(t, gw, "target")
			defer systest.KeepAlive(tgt, systest.Heartbeat)()
			wc := secDial(t, gw, "watcher")
			defer systest.KeepAlive(wc, systest.Heartbeat)()
			var p presence.Presence
			if everyone {
				init := watchEveryone(t, wc)
				p, _ = presenceOf(init, "target")
				if p.Status != presence.Online {
					// The target's connection was not in the index yet.
					p = systest.AwaitStatus(t, wc, "target", presence.Online)
				}
			} else {
				if err := wc.Subscribe("s", "target"); err != nil {
					t.Fatal(err)
				}
				p = systest.AwaitStatus(t, wc, "target", presence.Online)
			}
			if p.LastSeen == 0 {
				t.Fatalf("contact sees no last_seen: %+v", p)
			}
			seen := p.LastSeen

			// awaitLastSeen waits for a batch entry of target with or
			// without last_seen, and checks the HTTP API says the same.
			awaitLastSeen := func(step string, show bool) {
				t.Helper()
				start := time.Now()
				systest.Await(t, wc, systest.EventTimeout, step, func(m protocol.ServerMessage) bool {
					if m.Type != protocol.TypePresenceBatch {
						return false
					}
					p, ok := presenceOf(m, "target")
					return ok && p.Status == presence.Online && (p.LastSeen == seen) == show && (p.LastSeen == 0) == !show
				})
				if took := time.Since(start); took > 3*time.Second {
					t.Errorf("%s: took %v", step, took)
				}
				for where, p := range everyAPIView(t, gw, "watcher", "target", false, everyone) {
					if (p.LastSeen != 0) != show {
						t.Errorf("%s: %s says %+v, want last_seen shown %v", step, where, p, show)
					}
				}
			}
			if err := sys.Store.SetSettings(ctx, "target", presence.Settings{LastSeen: presence.Nobody}); err != nil {
				t.Fatal(err)
			}
			awaitLastSeen("setting nobody", false)
			if err := sys.Store.SetSettings(ctx, "target", presence.Settings{LastSeen: presence.Everyone}); err != nil {
				t.Fatal(err)
			}
			awaitLastSeen("setting everyone", true)
			if err := sys.Store.SetSettings(ctx, "target", presence.Settings{LastSeen: presence.Contacts}); err != nil {
				t.Fatal(err)
			}
			// Still a contact: nothing to change. The target unfollowing
			// the watcher makes them no longer a contact.
			if err := sys.Store.Unfollow(ctx, "target", "watcher"); err != nil {
				t.Fatal(err)
			}
			awaitLastSeen("no longer a contact", false)
			sys.Follow("target", "watcher")
			awaitLastSeen("a contact again", true)
		})
	}
}

// TestInvisibleNeverLeaks follows an invisible user through every path
// that could show them: the snapshot, batches, global presence (the
// presence_init list, online_count and its batches), and the HTTP user,
// query, friends and online answers. Everywhere, they look offline with
// the last_seen of the moment they went invisible.
func TestInvisibleNeverLeaks(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.Gateway()
	sys.Mutual("ghost", "friend", "marker")
	ctx := context.Background()
	if err := sys.Store.SetSettings(ctx, "ghost", presence.Settings{LastSeen: presence.Everyone}); err != nil {
		t.Fatal(err)
	}

	ghost := secDial(t, gw, "ghost", "web")
	defer systest.KeepAlive(ghost, systest.Heartbeat)()
	marker := secDial(t, gw, "marker")
	defer systest.KeepAlive(marker, systest.Heartbeat)()
	friend := secDial(t, gw, "friend")
	defer systest.KeepAlive(friend, systest.Heartbeat)()
	if err := friend.Subscribe("f", "ghost", "marker"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, friend, "ghost", presence.Online)
	global := secDial(t, gw, "global")
	defer systest.KeepAlive(global, systest.Heartbeat)()
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		var o onlineList
		apiCall(t, "GET", gw.HTTP+"/api/presence/online", bearer(secLongToken(t, "global")), nil, &o)
		if o.Count != 4 {
			return fmt.Errorf("online = %+v, want 4 users", o)
		}
		return nil
	})
	init := watchEveryone(t, global)
	if p, ok := presenceOf(init, "ghost"); !ok || p.Status != presence.Online || *init.OnlineCount != 4 {
		t.Fatalf("global presence_init = %+v, want ghost online among 4", init)
	}

	// Going invisible looks like going offline, to every watcher.
	if err := ghost.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, ghost, presence.Invisible, 1)
	gone := systest.AwaitStatus(t, friend, "ghost", presence.Offline)
	if g := systest.AwaitStatus(t, global, "ghost", presence.Offline); g != gone {
		t.Errorf("global watcher saw %+v, friend %+v", g, gone)
	}
	rec, err := sys.StatusOf("ghost")
	if err != nil {
		t.Fatal(err)
	}
	if gone.LastSeen == 0 || gone.LastSeen != rec.LastSeen {
		t.Fatalf("going invisible: %+v, want offline with last_seen %d", gone, rec.LastSeen)
	}

	// While invisible, the ghost comes and goes on other devices, idles
	// and is active: none of it reaches anyone else. A change of marker,
	// made after all of it, is the first thing both watchers see.
	phone := secDial(t, gw, "ghost", "phone")
	systest.AwaitSelf(t, ghost, presence.Invisible, 2)
	if err := phone.Send(protocol.ClientMessage{Type: protocol.TypeIdle}); err != nil {
		t.Fatal(err)
	}
	if err := ghost.Send(protocol.ClientMessage{Type: protocol.TypeIdle}); err != nil {
		t.Fatal(err)
	}
	if err := ghost.Send(protocol.ClientMessage{Type: protocol.TypeActivity}); err != nil {
		t.Fatal(err)
	}
	if err := phone.Close(); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, ghost, presence.Invisible, 1)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		rec, err := sys.StatusOf("ghost")
		if err != nil || len(rec.Conns) != 1 {
			return fmt.Errorf("ghost's phone still in the record: %+v %v", rec, err)
		}
		return nil
	})
	if err := marker.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*client.Conn{"friend": friend, "global": global} {
		systest.Await(t, c, systest.EventTimeout, "marker busy", func(m protocol.ServerMessage) bool {
			if p, ok := presenceOf(m, "ghost"); ok {
				t.Errorf("%s was told about the invisible ghost: %+v", name, p)
			}
			p, ok := presenceOf(m, "marker")
			return ok && p.Status == presence.Busy
		})
	}

	// Every other path: a new snapshot, a new global snapshot, HTTP.
	other := secDial(t, gw, "other")
	defer systest.KeepAlive(other, systest.Heartbeat)()
	if err := other.Subscribe("o", "ghost"); err != nil {
		t.Fatal(err)
	}
	oi := systest.Await(t, other, systest.EventTimeout, "presence_init o", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "o"
	})
	if p, _ := presenceOf(oi, "ghost"); p != gone {
		t.Errorf("snapshot of the invisible ghost = %+v, want %+v", p, gone)
	}
	// Global presence learns of other from its event, which may come
	// after other's own presence_init.
	var o onlineList
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/online", bearer(secLongToken(t, "friend")), nil, &o); st != 200 || o.Count != 4 || len(o.Users) != 4 {
			return fmt.Errorf("GET online = %d %+v, want 4 users", st, o)
		}
		return nil
	})
	for _, u := range o.Users {
		if u.UserID == "ghost" {
			t.Errorf("GET online lists the invisible ghost: %+v", o)
		}
	}
	ga := watchEveryone(t, other)
	if _, ok := presenceOf(ga, "ghost"); ok || ga.OnlineCount == nil || *ga.OnlineCount != 4 || len(ga.Users) != 4 {
		t.Errorf("global snapshot = %+v, want the 4 others (friend, global, marker, other) and no ghost", ga)
	}
	for where, p := range everyAPIView(t, gw, "friend", "ghost", true, false) {
		if p != gone {
			t.Errorf("%s: %+v, want %+v", where, p, gone)
		}
	}
	// Visible again: everyone sees it.
	if err := ghost.SetStatus("online"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, friend, "ghost", presence.Online)
	systest.AwaitStatus(t, global, "ghost", presence.Online)
	systest.AwaitStatus(t, other, "ghost", presence.Online)
}

// TestSettingsChangeReadsPresenceOnce: a change of a user's settings that
// changes what many sockets see of the user's last_seen shows the user
// again to each of them, with one read of the user's status record for
// them all, where it read the record once per socket.
func TestSettingsChangeReadsPresenceOnce(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyFollow}})
	gw := sys.Gateway()
	ctx := context.Background()
	if err := sys.Store.SetSettings(ctx, "target", presence.Settings{LastSeen: presence.Everyone}); err != nil {
		t.Fatal(err)
	}
	dialKept(t, sys, gw, "target")
	watchers := make([]*client.Conn, 20)
	contact := func(i int) bool { return i%2 == 0 }
	for i := range watchers {
		id := fmt.Sprintf("w%02d", i)
		sys.Follow(id, "target")
		if contact(i) {
			sys.Follow("target", id)
		}
		watchers[i] = dialKept(t, sys, gw, id)
		if err := watchers[i].Subscribe("s", "target"); err != nil {
			t.Fatal(err)
		}
		if p := systest.AwaitStatus(t, watchers[i], "target", presence.Online); p.LastSeen == 0 {
			t.Fatalf("%s sees no last_seen under everyone: %+v", id, p)
		}
	}
	reads := func() float64 {
		return metricValue(t, gw, "greendot_gateway_kv_seconds", map[string]string{"op": "get_status"})
	}
	before := reads()
	if err := sys.Store.SetSettings(ctx, "target", presence.Settings{LastSeen: presence.Contacts}); err != nil {
		t.Fatal(err)
	}
	for i, c := range watchers {
		if contact(i) {
			continue
		}
		systest.Await(t, c, systest.EventTimeout, fmt.Sprintf("w%02d shown the target without last_seen", i), func(m protocol.ServerMessage) bool {
			p, ok := presenceOf(m, "target")
			return m.Type == protocol.TypePresenceBatch && ok && p.Status == presence.Online && p.LastSeen == 0
		})
	}
	if n := reads() - before; n != 1 {
		t.Errorf("the status record was read %v times to show the target again to %d sockets, want once", n, len(watchers)/2)
	}
}
