package authz

import (
	"context"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/pkg/presence"
)

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
// once and, when they leave it to target's contacts, whether target
// follows each watcher, from the cache or by reads several at once (a
// read of all of target's follows, in one batch and not cached, cost as
// much as 8 to 14 of them when measured). An error reading the
// graph hides last_seen from the watchers it left undecided.
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

// followsEach reports, for each of others, whether user follows it: from
// the cache, or by reads several at once, one for each user not cached
// however often others names them.
func (a *Authorizer) followsEach(ctx context.Context, user string, others []string) ([]bool, error) {
	out := make([]bool, len(others))
	missing := make(map[string][]int) // a user not cached -> where others names them
	now := time.Now()
	a.mu.Lock()
	for i, o := range others {
		if e, ok := a.edges[presence.FollowKey(user, o)]; ok && now.Sub(e.at) < a.cfg.CacheTTL {
			out[i] = e.v
		} else {
			missing[o] = append(missing[o], i)
		}
	}
	a.mu.Unlock()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for o, at := range missing {
		g.Go(func() error {
			v, err := a.follows(gctx, user, o)
			for _, i := range at {
				out[i] = v
			}
			return err
		})
	}
	return out, g.Wait()
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
