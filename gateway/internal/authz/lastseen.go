package authz

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/presence"
)

// listAbove is how many of a user's follow edges a decision about many
// users reads one by one at most: beyond it, the list of everyone the
// user follows is read once instead. (Only that list: the keys of a
// user's follows share a prefix, which NATS finds at once, where to find
// those of a user's followers it walks the keys of every user who follows
// anyone.)
const listAbove = 16

// listFactor bounds how long a list of follows is read for a decision
// about n users: up to listFactor×n entries (NATS hands over a listed key
// for a fraction of what a read of its own costs). A longer list is given
// up, and the edges read one by one.
const listFactor = 8

// errLongList says a list of follows was longer than the reads it would
// save.
var errLongList = errors.New("list of follows longer than the reads it would save")

// maxLists bounds the lists of follows cached (each may be long; they
// serve the users who change again within the cache's TTL); a full cache
// is emptied.
const maxLists = 1_000

// ShowLastSeen reports whether watcher may see target's last_seen. It
// reads target's settings, and whether target follows watcher only when
// the settings leave it to target's contacts. An error reading the graph
// hides it.
func (a *Authorizer) ShowLastSeen(ctx context.Context, watcher, target string) bool {
	if watcher == target {
		return true
	}
	if a.cfg.Policy.external() {
		d, err := a.Decide(ctx, watcher, target)
		return d.LastSeen && err == nil
	}
	st, err := a.settingsOf(ctx, target)
	if err != nil {
		return false
	}
	if st.LastSeenVisibility() != presence.Contacts {
		return st.ShowLastSeen(false, false)
	}
	back, err := a.follows(ctx, target, watcher)
	return back && err == nil
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
		contact, err := a.followsEach(ctx, target, ask)
		for j, i := range at {
			out[i] = err == nil && contact[j]
		}
	}
	return out
}

// LastSeenOf reports, for each of targets, whether watcher may see its
// last_seen, as ShowLastSeen does, several at once: for a list of users
// shown to one watcher (global presence's presence_init and GET
// /api/presence/online). An error reading the graph hides last_seen from
// the targets it left undecided.
func (a *Authorizer) LastSeenOf(ctx context.Context, watcher string, targets []string) []bool {
	out := make([]bool, len(targets))
	if a.cfg.Policy.external() {
		ds, err := a.decideExternal(ctx, watcher, targets)
		for i, t := range targets {
			out[i] = t == watcher || err == nil && ds[i].LastSeen
		}
		return out
	}
	var g errgroup.Group
	g.SetLimit(readConcurrency)
	for i, t := range targets {
		g.Go(func() error {
			out[i] = a.ShowLastSeen(ctx, watcher, t)
			return nil
		})
	}
	_ = g.Wait()
	return out
}

// followsEach reports, for each of others, whether user follows it. The
// edges cached are taken from the cache; the rest are read as the list of
// everyone user follows, in one read cached like the edges, when there
// are more than listAbove of them and the list is not too long for it,
// and else one by one, several at once.
func (a *Authorizer) followsEach(ctx context.Context, user string, others []string) ([]bool, error) {
	out := make([]bool, len(others))
	var missing []int
	now := time.Now()
	a.mu.Lock()
	for i, o := range others {
		if e, ok := a.edges[presence.FollowKey(user, o)]; ok && now.Sub(e.at) < a.cfg.CacheTTL {
			out[i] = e.v
		} else {
			missing = append(missing, i)
		}
	}
	a.mu.Unlock()
	if len(missing) > listAbove {
		set, err := a.following(ctx, user, len(missing))
		if err == nil {
			for _, i := range missing {
				out[i] = set[others[i]]
			}
			return out, nil
		}
		if !errors.Is(err, errLongList) {
			return nil, err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for _, i := range missing {
		g.Go(func() error {
			var err error
			out[i], err = a.follows(gctx, user, others[i])
			return err
		})
	}
	return out, g.Wait()
}

// following returns everyone user follows, as a set, from the cache if it
// is there, or errLongList when they are more than listFactor×n, for a
// decision about n users.
func (a *Authorizer) following(ctx context.Context, user string, n int) (map[string]bool, error) {
	return readThrough(a, a.lists, maxLists, user, func() (map[string]bool, error) {
		users, all, err := a.cfg.Graph.FollowingAtMost(ctx, user, listFactor*n)
		if err != nil {
			return nil, err
		}
		if !all {
			return nil, errLongList
		}
		set := make(map[string]bool, len(users))
		for _, u := range users {
			set[u] = true
		}
		return set, nil
	})
}

// listed reports whether x follows y from the list of x's follows in the
// cache, if it is there.
func (a *Authorizer) listed(x, y string) (follows, ok bool) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.lists[x]; ok && now.Sub(e.at) < a.cfg.CacheTTL {
		return e.v[y], true
	}
	return false, false
}

// prefetchFollowing reads the list of everyone target follows before the
// subscriptions of watchers to target are re-checked, when they are of
// more than listAbove users: whether target follows each watcher (a
// contact, and under the mutual policy allowed) then needs no read of its
// own. A list that cannot be read leaves the re-checks to read the edges.
func (a *Authorizer) prefetchFollowing(ctx context.Context, target string, watchers []hub.Watcher) {
	if a.cfg.Policy.external() {
		return
	}
	users := make(map[string]bool)
	for _, w := range watchers {
		users[w.UserID()] = true
	}
	if len(users) > listAbove {
		_, _ = a.following(ctx, target, len(users))
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
