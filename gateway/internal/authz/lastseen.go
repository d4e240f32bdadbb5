package authz

import (
	"context"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/presence"
)

// listAbove is how many follow edges of one user a decision about many
// users reads one by one at most: beyond it, the user's list of follows
// (or followers) is read once instead.
const listAbove = 16

// maxLists bounds the lists of follows cached (each may be long; they
// serve the users who change again within the cache's TTL); a full cache
// is emptied.
const maxLists = 1_000

// The keys of a.lists: a user's follows, and a user's followers.
func followingOf(u string) string { return "o." + u }
func followersOf(u string) string { return "i." + u }

// ShowLastSeen reports whether watcher may see target's last_seen. An
// error reading the graph hides it.
func (a *Authorizer) ShowLastSeen(ctx context.Context, watcher, target string) bool {
	if watcher == target {
		return true
	}
	if a.cfg.Policy.external() {
		d, err := a.Decide(ctx, watcher, target)
		return d.LastSeen && err == nil
	}
	back, err := a.follows(ctx, target, watcher)
	if err != nil {
		return false
	}
	show, err := a.lastSeen(ctx, target, back)
	return show && err == nil
}

// LastSeenTo reports, for each of watchers, whether it may see target's
// last_seen, as ShowLastSeen does: for a change of target that many
// watchers are told of (global presence). It reads target's settings
// once and, when they leave it to target's contacts, the edges from
// target that are not cached: one by one, or as everyone target follows,
// in one read, when there are more than listAbove of them. An error
// reading the graph hides last_seen from the watchers it left undecided.
func (a *Authorizer) LastSeenTo(ctx context.Context, target string, watchers []string) []bool {
	out := make([]bool, len(watchers))
	if a.cfg.Policy.external() {
		for i, w := range watchers {
			out[i] = a.ShowLastSeen(ctx, w, target)
		}
		return out
	}
	st, err := a.settingsOf(ctx, target)
	if err != nil || st.LastSeenVisibility() != presence.Contacts {
		for i, w := range watchers {
			out[i] = w == target || err == nil && st.ShowLastSeen(false, false)
		}
		return out
	}
	var ask []string // the watchers other than target
	var at []int
	for i, w := range watchers {
		if w == target {
			out[i] = true
		} else {
			ask, at = append(ask, w), append(at, i)
		}
	}
	if len(ask) > 0 {
		contact, err := a.edgesOf(ctx, target, ask, true)
		for j, i := range at {
			out[i] = err == nil && contact[j]
		}
	}
	return out
}

// LastSeenOf reports, for each of targets, whether watcher may see its
// last_seen, as ShowLastSeen does: for a list of users shown to one
// watcher (global presence's presence_init and GET
// /api/presence/online). It reads the settings of the targets not cached,
// several at once, and the edges to watcher from those whose settings
// leave it to their contacts: one by one, or as watcher's followers, in
// one read, when there are more than listAbove of them. An error reading
// the graph hides last_seen from the targets it left undecided.
func (a *Authorizer) LastSeenOf(ctx context.Context, watcher string, targets []string) []bool {
	out := make([]bool, len(targets))
	if a.cfg.Policy.external() {
		ds, err := a.decideExternal(ctx, watcher, targets)
		for i, t := range targets {
			out[i] = t == watcher || err == nil && ds[i].LastSeen
		}
		return out
	}
	settings := make([]presence.Settings, len(targets))
	known := make([]bool, len(targets))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, t := range targets {
		if t == watcher {
			continue
		}
		g.Go(func() error {
			st, err := a.settingsOf(gctx, t)
			settings[i], known[i] = st, err == nil
			return nil // the others are still decided
		})
	}
	_ = g.Wait()
	var ask []string // the targets that show last_seen to their contacts
	var at []int
	for i, t := range targets {
		switch {
		case t == watcher:
			out[i] = true
		case !known[i]:
		case settings[i].LastSeenVisibility() == presence.Contacts:
			ask, at = append(ask, t), append(at, i)
		default:
			out[i] = settings[i].ShowLastSeen(false, false)
		}
	}
	if len(ask) > 0 {
		contact, err := a.edgesOf(ctx, watcher, ask, false)
		for j, i := range at {
			out[i] = err == nil && contact[j]
		}
	}
	return out
}

// edgesOf reports, for each of others, whether user follows it (from
// true) or it follows user (from false). The edges cached are taken from
// the cache; the rest are read one by one, several at once, or, when
// there are more than listAbove of them, as user's list of follows or
// followers, in one read, cached like the edges.
func (a *Authorizer) edgesOf(ctx context.Context, user string, others []string, from bool) ([]bool, error) {
	key := func(o string) string {
		if from {
			return presence.FollowKey(user, o)
		}
		return presence.FollowKey(o, user)
	}
	out := make([]bool, len(others))
	var missing []int
	now := time.Now()
	a.mu.Lock()
	for i, o := range others {
		if e, ok := a.edges[key(o)]; ok && now.Sub(e.at) < a.cfg.CacheTTL {
			out[i] = e.v
		} else {
			missing = append(missing, i)
		}
	}
	a.mu.Unlock()
	if len(missing) <= listAbove {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(readConcurrency)
		for _, i := range missing {
			g.Go(func() error {
				var err error
				if from {
					out[i], err = a.follows(gctx, user, others[i])
				} else {
					out[i], err = a.follows(gctx, others[i], user)
				}
				return err
			})
		}
		return out, g.Wait()
	}
	set, err := a.listOf(ctx, user, from)
	if err != nil {
		return nil, err
	}
	for _, i := range missing {
		out[i] = set[others[i]]
	}
	return out, nil
}

// listOf returns everyone user follows (from true) or everyone who
// follows user (from false), as a set, from the cache if it is there.
func (a *Authorizer) listOf(ctx context.Context, user string, from bool) (map[string]bool, error) {
	key, read := followersOf(user), a.cfg.Graph.Followers
	if from {
		key, read = followingOf(user), a.cfg.Graph.Following
	}
	return readThrough(a, a.lists, maxLists, key, func() (map[string]bool, error) {
		users, err := read(ctx, user)
		if err != nil {
			return nil, err
		}
		set := make(map[string]bool, len(users))
		for _, u := range users {
			set[u] = true
		}
		return set, nil
	})
}

// listed reports whether x follows y from a list of x's follows or of
// y's followers in the cache, if one is there.
func (a *Authorizer) listed(x, y string) (follows, ok bool) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.lists[followingOf(x)]; ok && now.Sub(e.at) < a.cfg.CacheTTL {
		return e.v[y], true
	}
	if e, ok := a.lists[followersOf(y)]; ok && now.Sub(e.at) < a.cfg.CacheTTL {
		return e.v[x], true
	}
	return false, false
}

// prefetchLists reads target's follows, and under the policies that ask
// whether the watcher follows the target its followers too, before the
// subscriptions of watchers to target are re-checked, when they are of
// more than listAbove users: their re-checks then read no edge one by
// one. A list that cannot be read leaves the re-checks to read the edges.
func (a *Authorizer) prefetchLists(ctx context.Context, target string, watchers []hub.Watcher) {
	if a.cfg.Policy.external() {
		return
	}
	users := make(map[string]bool)
	for _, w := range watchers {
		users[w.UserID()] = true
	}
	if len(users) <= listAbove {
		return
	}
	_, _ = a.listOf(ctx, target, true)
	if a.cfg.Policy != Everyone {
		_, _ = a.listOf(ctx, target, false)
	}
}

// lastSeen reports whether a watcher may see target's last_seen; contact
// says whether target follows the watcher.
func (a *Authorizer) lastSeen(ctx context.Context, target string, contact bool) (bool, error) {
	st, err := a.settingsOf(ctx, target)
	if err != nil {
		return false, err
	}
	return st.ShowLastSeen(false, contact), nil
}
