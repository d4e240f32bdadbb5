package gateway

import (
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/presence"
)

// onlineIndex serves global presence under the everyone policy: it keeps
// every user others see as online, away or busy, from a watcher of
// presence_status, and delivers every visible change to the sockets that
// watch everyone ("all": true). It is safe for concurrent use.
type onlineIndex struct {
	s *Service

	mu     sync.RWMutex
	users  map[string]onlineEntry // users others see as connected
	all    map[*conn]struct{}
	synced bool
}

type onlineEntry struct {
	p      presence.Presence
	pubVer uint64
	at     int64
}

func newOnlineIndex(s *Service) *onlineIndex {
	return &onlineIndex{s: s, users: make(map[string]onlineEntry), all: make(map[*conn]struct{})}
}

// start watches presence_status until ctx is canceled, in a goroutine.
func (o *onlineIndex) start(ctx context.Context, store *presence.Store, log *slog.Logger) error {
	w, err := store.WatchStatus(ctx)
	if err != nil {
		return err
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					o.mu.Lock()
					o.synced = true
					o.mu.Unlock()
					continue
				}
				o.apply(ctx, e, log)
			}
		}
	}()
	return nil
}

// apply takes one revision of presence_status.
func (o *onlineIndex) apply(ctx context.Context, e jetstream.KeyValueEntry, log *slog.Logger) {
	userID := e.Key()
	if !presence.ValidUserID(userID) {
		return
	}
	next := onlineEntry{p: presence.Presence{UserID: userID, Status: presence.Offline}}
	if e.Operation() == jetstream.KeyValuePut {
		var rec presence.Record
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			log.Warn("undecodable status record", "user_id", userID, "err", err)
			return
		}
		next = onlineEntry{p: rec.Presence(userID), pubVer: rec.PubVer, at: rec.Updated}
	}
	visible := next.p.Status.Visible()

	o.mu.Lock()
	prev, was := o.users[userID]
	switch {
	case visible && (!was || prev.pubVer != next.pubVer || prev.p != next.p):
		o.users[userID] = next
	case !visible && was:
		delete(o.users, userID)
	default:
		o.mu.Unlock()
		return // nothing others can see changed
	}
	watchers := make([]*conn, 0, len(o.all))
	if o.synced {
		for c := range o.all {
			watchers = append(watchers, c)
		}
	}
	o.mu.Unlock()

	for _, c := range watchers {
		p := next.p
		if !o.s.showLastSeen(ctx, c.userID, userID) {
			p.LastSeen = 0
		}
		c.enqueue(p, next.at)
	}
}

// subscribe makes c watch everyone and returns the online users (at most
// limit, by user id) and how many there are. The caller holds c.wmu until
// it has written the answer, so no batch overtakes it.
func (o *onlineIndex) subscribe(c *conn, limit int) (users []presence.Presence, count int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.synced {
		return nil, 0, ErrUnavailable
	}
	if c.closed.Load() {
		return nil, 0, errConnClosed
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
