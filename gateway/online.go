package gateway

import (
	"context"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/presence"
)

// onlineIndex serves global presence under the everyone policy: it keeps
// every user others see as online, away or busy, and delivers every
// visible change to the sockets that watch everyone ("all": true).
//
// It learns changes from the same presence events every other subscription
// gets (the gateway subscribes to all of them under this policy), after
// one read of every status record when it starts (sync) and when the NATS
// connection comes back. Each user's newest revision is kept, so that an
// event older than what the index has, however late it comes, changes
// nothing. It is safe for concurrent use.
type onlineIndex struct {
	// lastSeenTo says which of watchers (user ids) may see target's
	// last_seen.
	lastSeenTo func(ctx context.Context, target string, watchers []string) []bool
	// oneByOne reports whether a socket watches a user through the hub
	// too: the hub delivers that user's changes to it, in the order of
	// their revisions, which the index's later deliveries could undo.
	oneByOne func(w hub.Watcher, user string) bool

	mu     sync.RWMutex
	users  map[string]onlineEntry // users others see as connected
	gone   map[string]goneEntry   // revisions of users seen going offline
	all    map[*conn]struct{}
	synced bool

	// changed holds the changes that wait to be delivered to the
	// watchers, the newest per user, for a goroutine of its own (run):
	// deciding what each watcher may see can read the graph, which must
	// not hold up the event dispatcher. wake tells run there are some.
	changed map[string]onlineEntry
	// again holds the users to be shown again to the sockets watching
	// everyone, as they may now see them (reshow): to those of the user
	// ids of the set, or to all for a nil set.
	again map[string]map[string]bool
	wake  chan struct{}

	// beforeRound, when set (by tests), runs with the users whose changes
	// the index is about to deliver to the sockets watching everyone.
	beforeRound atomic.Pointer[func(users []string)]
}

type onlineEntry struct {
	p   presence.Presence
	rev uint64
	at  int64 // when the revision was written, unix ms
}

// goneEntry remembers the revision at which a user went offline, for a
// while: an older event that comes later (a safety-net publication of an
// earlier revision) must not bring them back.
type goneEntry struct {
	rev  uint64
	seen time.Time
}

// goneFor is how long the revision of a user who went offline is kept.
const goneFor = 5 * time.Minute

// newOnlineIndex returns an index that asks lastSeenTo which watchers
// may see a user's last_seen, and oneByOne whether a socket watches the
// user through the hub too (then it leaves the user's changes to the hub).
func newOnlineIndex(lastSeenTo func(ctx context.Context, target string, watchers []string) []bool, oneByOne func(w hub.Watcher, user string) bool) *onlineIndex {
	return &onlineIndex{
		lastSeenTo: lastSeenTo,
		oneByOne:   oneByOne,
		users:      make(map[string]onlineEntry),
		gone:       make(map[string]goneEntry),
		all:        make(map[*conn]struct{}),
		changed:    make(map[string]onlineEntry),
		again:      make(map[string]map[string]bool),
		wake:       make(chan struct{}, 1),
	}
}

// sync reads every status record and takes what is newer than what the
// index has. After the first sync (on the NATS connection coming back),
// what changed is delivered to the watchers like an event.
func (o *onlineIndex) sync(ctx context.Context, store *presence.Store) error {
	err := store.ScanStatus(ctx, func(userID string, rec presence.Record, rev uint64) error {
		o.take(onlineEntry{p: rec.Presence(userID), rev: rev, at: rec.Updated})
		return nil
	})
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.synced = true
	o.mu.Unlock()
	return nil
}

// apply takes one presence event. It runs on the dispatcher and does not
// block.
func (o *onlineIndex) apply(ev *presence.Event) {
	o.take(onlineEntry{p: ev.Presence(), rev: ev.Rev, at: ev.At})
}

// take records a user's presence at a revision, if it is newer than what
// the index has and changes what others see, and queues it for the
// watchers once the first sync is done (before it, no socket watches).
func (o *onlineIndex) take(e onlineEntry) {
	u := e.p.UserID
	o.mu.Lock()
	prev, was := o.users[u]
	if was && e.rev <= prev.rev || !was && e.rev <= o.gone[u].rev {
		o.mu.Unlock()
		return
	}
	visible := e.p.Status.Visible()
	switch {
	case visible && (!was || prev.p != e.p):
		o.users[u] = e
		delete(o.gone, u)
	case visible:
		o.users[u] = e // the same, at a newer revision
		o.mu.Unlock()
		return
	case was:
		delete(o.users, u)
		o.gone[u] = goneEntry{rev: e.rev, seen: time.Now()}
	default:
		o.gone[u] = goneEntry{rev: e.rev, seen: time.Now()}
		o.mu.Unlock()
		return
	}
	deliver := o.synced && len(o.all) > 0
	if deliver {
		o.changed[u] = e
	}
	o.mu.Unlock()
	if deliver {
		o.poke()
	}
}

// reshow has user shown again to the sockets watching everyone (of user
// id watcher only, unless it is ""), as they may now see user: a graph
// change may have changed whether they see user's last_seen. A user not
// seen as connected is in no socket's list, and is not shown.
func (o *onlineIndex) reshow(user, watcher string) {
	o.mu.Lock()
	_, online := o.users[user]
	deliver := online && o.synced && len(o.all) > 0
	if deliver {
		set, queued := o.again[user]
		switch {
		case watcher == "":
			o.again[user] = nil
		case !queued:
			o.again[user] = map[string]bool{watcher: true}
		case set != nil:
			set[watcher] = true
		}
	}
	o.mu.Unlock()
	if deliver {
		o.poke()
	}
}

// poke tells run there are changes to deliver.
func (o *onlineIndex) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// run delivers the changes to the sockets watching everyone until ctx is
// canceled, and forgets revisions of users who went offline long ago.
func (o *onlineIndex) run(ctx context.Context) {
	t := time.NewTicker(goneFor)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			o.mu.Lock()
			for u, g := range o.gone {
				if now.Sub(g.seen) > goneFor {
					delete(o.gone, u)
				}
			}
			o.mu.Unlock()
		case <-o.wake:
			// The changes and the sockets they go to are taken at once:
			// a socket that starts watching after them has them (or
			// newer) in its presence_init, and must not get them again.
			o.mu.Lock()
			changed := o.changed
			o.changed = make(map[string]onlineEntry)
			type shown struct {
				e  onlineEntry
				to map[string]bool
			}
			var again []shown
			for u, to := range o.again {
				if e, ok := o.users[u]; ok {
					if _, sent := changed[u]; !sent { // to every socket already
						again = append(again, shown{e, to})
					}
				}
			}
			clear(o.again)
			watchers := o.allWatchersLocked()
			o.mu.Unlock()
			if hook := o.beforeRound.Load(); hook != nil {
				(*hook)(slices.Collect(maps.Keys(changed)))
			}
			for _, e := range changed {
				o.deliver(ctx, e, watchers, nil)
			}
			for _, a := range again {
				o.deliver(ctx, a.e, watchers, a.to)
			}
		}
	}
}

// deliver hands a user's presence to the sockets of watchers (of the
// user ids of to only, unless it is nil) that do not watch the user one
// by one, with its last_seen to those that may see it.
func (o *onlineIndex) deliver(ctx context.Context, e onlineEntry, watchers []*conn, to map[string]bool) {
	var conns []*conn
	var ids []string
	for _, c := range watchers {
		if (to == nil || to[c.userID]) && !o.oneByOne(c, e.p.UserID) {
			conns, ids = append(conns, c), append(ids, c.userID)
		}
	}
	if len(conns) == 0 {
		return
	}
	show := o.lastSeenTo(ctx, e.p.UserID, ids)
	for i, c := range conns {
		p := e.p
		if !show[i] {
			p.LastSeen = 0
		}
		c.Deliver(p, e.at)
	}
}

// subscribe makes c watch everyone and returns the online users (at most
// limit, by user id) and how many there are. The caller holds c's box
// until it has written the answer, so no batch overtakes it.
func (o *onlineIndex) subscribe(c *conn, limit int) (users []presence.Presence, count int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.synced {
		return nil, 0, ErrUnavailable
	}
	if c.closed.Load() {
		return nil, 0, hub.ErrClosed
	}
	o.all[c] = struct{}{}
	return o.listLocked(limit), len(o.users), nil
}

// unsubscribe stops c watching everyone.
func (o *onlineIndex) unsubscribe(c *conn) {
	o.mu.Lock()
	delete(o.all, c)
	o.mu.Unlock()
}

// watching reports whether c watches everyone.
func (o *onlineIndex) watching(c *conn) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	_, ok := o.all[c]
	return ok
}

// list returns the online users (at most limit, by user id) and how many
// there are.
func (o *onlineIndex) list(limit int) ([]presence.Presence, int, error) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if !o.synced {
		return nil, 0, ErrUnavailable
	}
	return o.listLocked(limit), len(o.users), nil
}

func (o *onlineIndex) listLocked(limit int) []presence.Presence {
	ids := make([]string, 0, len(o.users))
	for u := range o.users {
		ids = append(ids, u)
	}
	sort.Strings(ids)
	if len(ids) > limit {
		ids = ids[:limit]
	}
	out := make([]presence.Presence, len(ids))
	for i, u := range ids {
		out[i] = o.users[u].p
	}
	return out
}

// allCount returns how many sockets watch every user.
func (o *onlineIndex) allCount() int {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return len(o.all)
}

// allWatchers returns the sockets watching every user.
func (o *onlineIndex) allWatchers() []*conn {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.allWatchersLocked()
}

// allWatchersLocked is allWatchers for a caller holding o.mu.
func (o *onlineIndex) allWatchersLocked() []*conn {
	out := make([]*conn, 0, len(o.all))
	for c := range o.all {
		out = append(out, c)
	}
	return out
}

// userIDs returns the users' ids.
func userIDs(users []presence.Presence) []string {
	ids := make([]string, len(users))
	for i, p := range users {
		ids[i] = p.UserID
	}
	return ids
}

// hideLastSeen takes last_seen out of each user's presence that show
// (one per user) does not show it in.
func hideLastSeen(users []presence.Presence, show []bool) {
	for i := range users {
		if !show[i] {
			users[i].LastSeen = 0
		}
	}
}
