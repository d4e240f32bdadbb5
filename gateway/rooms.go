package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// room is one room's member table, and the local connections it is
// shown to.
type room struct {
	id  string
	hub *roomHub
	// refs counts the local connections that joined it, or are joining
	// (guarded by hub.mu); sub and ready are set up by the first.
	refs int
	sub  *nats.Subscription
	// sigSub carries the room's signals.
	sigSub *nats.Subscription
	ready  chan struct{}
	err    error // why the first listing failed; set before ready closes
	// listMu is held while the room's keys are listed (list).
	listMu sync.Mutex

	// mu guards what follows. A local connection's flush reads the log
	// under a read lock, and writes only its own view's seen and
	// notified: each connection flushes one frame at a time.
	mu sync.RWMutex
	// listing is set while the room's keys are listed: events wait in
	// buffered meanwhile.
	listing  bool
	buffered []presence.RoomEvent
	// ended holds the leases that ended while the room's keys were
	// listed: the listing may have read their keys before the reaper
	// removed them, so they are dropped after it.
	ended   []presence.RoomLeaseEnded
	members map[string]*roomMember // by connection id
	users   map[string]int         // connections in the room per user
	// gone holds the revision of connections that left, so that neither a
	// late event older than the leave nor a listing that read the key
	// before it went (the reaper publishes a dead lease's leaves, then
	// removes its keys) brings them back. It is cleared when it grows
	// beyond the members' number: such an event or key is at most a few
	// round trips late.
	gone   map[string]uint64
	locals map[*conn]*roomView
	// log holds the table's changes that some local connection has not
	// been shown yet. Each change is recorded once, whatever the number
	// of local connections; each takes what it follows on its next flush.
	log changeLog
}

// roomChange is one change of a room's table: a connection joined or
// changed its meta (m set), or left (m nil). counted says that the
// room's user count moved with it.
type roomChange struct {
	connID, userID string
	m              *roomMember
	counted        bool
}

// changeLog is a sequence of changes, numbered from 1, of which the
// oldest are dropped once every reader has taken them.
type changeLog struct {
	// list[i] is change start+1+i; seq is the newest change's number.
	list  []roomChange
	start uint64
	seq   uint64
	// trimAt is the length at which the log is due to be trimmed.
	trimAt int
}

// minTrim is the shortest log that is trimmed.
const minTrim = 256

// add appends a change.
func (l *changeLog) add(ch roomChange) {
	l.seq++
	l.list = append(l.list, ch)
}

// skip counts a change that no reader will take: the log stays empty.
func (l *changeLog) skip() {
	l.seq++
	l.list, l.start = l.list[:0], l.seq
}

// since returns the changes after number seen, which must not be older
// than what was trimmed.
func (l *changeLog) since(seen uint64) []roomChange { return l.list[seen-l.start:] }

// due reports whether the log is long enough to be trimmed.
func (l *changeLog) due() bool { return len(l.list) >= max(l.trimAt, minTrim) }

// trim drops the changes up to number oldest, the oldest any reader has
// seen. Its next trim is due when the log has doubled from what is left,
// so that a reader that lags (a socket slow to write) makes trimming cost
// no more than a constant share of adding.
func (l *changeLog) trim(oldest uint64) {
	if drop := int(min(oldest, l.seq) - l.start); drop > 0 {
		l.list = slices.Delete(l.list, 0, drop)
		l.start += uint64(drop)
	}
	l.trimAt = 2 * len(l.list)
}

// roomMember is one connection in a room, as its key says.
type roomMember struct {
	userID, gateway, epoch string
	meta                   json.RawMessage
	since                  int64
	rev                    uint64
}

// roomView is what a local connection was shown of a room and what
// changed since.
type roomView struct {
	// shown are the users it was shown, when the room was truncated for
	// it; nil when it was shown every user.
	shown map[string]bool
	// seen is the newest change of the log it was shown; notified says
	// that a later one concerns it (if only by the count) and its
	// connection was told to flush.
	seen     uint64
	notified bool
	// signals wait for the next room_signal frame: the newest of each
	// connection and signal type.
	signals map[signalKey]*pendingSignal
}

// signalKey is a connection's signal of one type.
type signalKey struct{ conn, signal string }

// open subscribes to the room's events, then lists its keys: the
// subscription comes first, so that no event published after the listing
// began is missed.
func (r *room) open(ctx context.Context) error {
	r.mu.Lock()
	r.listing = true
	r.mu.Unlock()
	sub, err := r.hub.subscribe(r, presence.RoomSubject(r.id), false)
	if err != nil {
		return err
	}
	sigSub, err := r.hub.subscribe(r, presence.RoomSignalSubject(r.id), true)
	if err != nil {
		r.hub.unsubscribe(sub)
		return err
	}
	r.hub.mu.Lock()
	r.sub, r.sigSub = sub, sigSub
	r.hub.mu.Unlock()
	if err := r.hub.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("subscribe to room %q: %w", r.id, err)
	}
	return r.list(ctx)
}

// list reads the room's keys and makes them the table, with the events
// that came meanwhile applied over them, and tells the local connections
// what changed.
func (r *room) list(ctx context.Context) error {
	// One listing at a time: one that ended while another read the keys
	// would let events apply unbuffered, which the other's older keys
	// would then undo.
	r.listMu.Lock()
	defer r.listMu.Unlock()
	r.mu.Lock()
	r.listing = true
	r.mu.Unlock()
	entries, err := r.hub.store.RoomMembers(ctx, r.id)
	if hook := r.hub.afterRead.Load(); hook != nil {
		(*hook)()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	buffered, ended := r.buffered, r.ended
	r.listing, r.buffered, r.ended = false, nil, nil
	if err == nil {
		r.takeListingLocked(membersOf(entries))
	}
	for i := range buffered {
		r.applyLocked(&buffered[i])
	}
	for _, e := range ended {
		r.dropLeaseLocked(e.Gateway, e.Epoch)
	}
	return err
}

// takeListingLocked makes the members a listing read the table, but for
// keys of connections whose leave the table has applied (see gone).
func (r *room) takeListingLocked(fresh map[string]*roomMember) {
	for id, f := range fresh {
		if f.rev <= r.gone[id] {
			delete(fresh, id)
		}
	}
	for id, m := range r.members {
		if f, ok := fresh[id]; !ok {
			r.removeLocked(id, m)
		} else if f.rev != m.rev {
			r.putLocked(id, f)
		}
	}
	for id, f := range fresh {
		if _, ok := r.members[id]; !ok {
			r.putLocked(id, f)
		}
	}
}

// membersOf returns the members a listing of a room's keys shows, by
// connection id: of a connection with keys under two leases (the one
// before not yet removed by the reaper), the newest.
func membersOf(entries []presence.RoomEntry) map[string]*roomMember {
	out := make(map[string]*roomMember, len(entries))
	for _, e := range entries {
		if f := out[e.Member.ConnID]; f != nil && f.rev > e.Rev {
			continue
		}
		out[e.Member.ConnID] = &roomMember{userID: e.Member.UserID, gateway: e.Member.Gateway,
			epoch: e.Member.Epoch, meta: e.Value.Meta, since: e.Value.Since, rev: e.Rev}
	}
	return out
}

// onEvent takes one event of the room from NATS.
func (r *room) onEvent(msg *nats.Msg) {
	var ev presence.RoomEvent
	if err := json.Unmarshal(msg.Data, &ev); err != nil || ev.Room != r.id || !presence.ValidUserID(ev.UserID) {
		r.hub.log.Warn("undecodable room event", "subject", msg.Subject, "err", err)
		return
	}
	r.apply(&ev)
}

// apply applies one event to the table, or keeps it for after the
// listing under way.
func (r *room) apply(ev *presence.RoomEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.listing {
		r.buffered = append(r.buffered, *ev)
		return
	}
	r.applyLocked(ev)
}

// applyLocked applies an event, unless it is not newer than what the
// table has of its connection: events of one connection apply in the
// order of their revisions, and a leave only to the key it names.
func (r *room) applyLocked(ev *presence.RoomEvent) {
	cur := r.members[ev.ConnID]
	switch ev.Op {
	case presence.RoomJoin, presence.RoomUpdate:
		if cur != nil && ev.Rev <= cur.rev || ev.Rev <= r.gone[ev.ConnID] {
			return
		}
		r.putLocked(ev.ConnID, &roomMember{userID: ev.UserID, gateway: ev.Gateway, epoch: ev.Epoch,
			meta: ev.Meta, since: ev.Since, rev: ev.Rev})
	case presence.RoomLeave:
		if cur == nil || cur.gateway != ev.Gateway || cur.epoch != ev.Epoch || ev.Rev < cur.rev {
			return
		}
		if r.gone == nil || len(r.gone) > len(r.members)+1024 {
			r.gone = make(map[string]uint64)
		}
		r.gone[ev.ConnID] = ev.Rev
		r.removeLocked(ev.ConnID, cur)
	}
}

// leaseEnded drops the members held under a lease that ended, or has
// the listing under way drop them once it is over.
func (r *room) leaseEnded(gw, epoch string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.listing {
		r.ended = append(r.ended, presence.RoomLeaseEnded{Gateway: gw, Epoch: epoch})
		return
	}
	r.dropLeaseLocked(gw, epoch)
}

// dropLeaseLocked drops the members held under a lease.
func (r *room) dropLeaseLocked(gw, epoch string) {
	for id, m := range r.members {
		if m.gateway == gw && m.epoch == epoch {
			r.removeLocked(id, m)
		}
	}
}

// putLocked sets a member and records the change.
func (r *room) putLocked(connID string, m *roomMember) {
	newUser := false
	if old := r.members[connID]; old == nil {
		r.users[m.userID]++
		newUser = r.users[m.userID] == 1
	}
	r.members[connID] = m
	r.recordLocked(roomChange{connID: connID, userID: m.userID, m: m, counted: newUser})
}

// removeLocked takes a member out and records the change.
func (r *room) removeLocked(connID string, m *roomMember) {
	delete(r.members, connID)
	userGone := false
	if r.users[m.userID]--; r.users[m.userID] <= 0 {
		delete(r.users, m.userID)
		userGone = true
	}
	r.recordLocked(roomChange{connID: connID, userID: m.userID, counted: userGone})
}

// recordLocked appends a change to the log and tells the local
// connections it concerns that are not told yet. A connection shown a
// truncated room hears of users it was not shown only when the count
// moves.
func (r *room) recordLocked(ch roomChange) {
	if len(r.locals) == 0 {
		r.log.skip()
		return
	}
	r.log.add(ch)
	for c, v := range r.locals {
		switch {
		case v.notified:
		case ch.counted || v.shows(ch.userID):
			v.notified = true
			c.roomsChanged()
		default:
			// Nothing it follows changed since its seen: it has taken the
			// whole log, and must not keep it from being trimmed (a view
			// of a truncated room is not told of most changes).
			v.seen = r.log.seq
		}
	}
	if r.log.due() {
		oldest := r.log.seq
		for _, v := range r.locals {
			oldest = min(oldest, v.seen)
		}
		r.log.trim(oldest)
	}
}

// shows reports whether the view follows a user.
func (v *roomView) shows(userID string) bool { return v.shown == nil || v.shown[userID] }

// show makes c a local connection of the room, shown at most maxUsers
// users, and returns the room_state that shows them; what changes after
// it goes in room_diff frames. A connection shown it again (a second
// join) starts over from the new state.
func (r *room) show(c *conn, id string, maxUsers int) *protocol.RoomState {
	r.mu.Lock()
	defer r.mu.Unlock()
	users := firstUsers(r.users, maxUsers)
	v := &roomView{seen: r.log.seq}
	st := &protocol.RoomState{Type: protocol.TypeRoomState, ID: id, Room: r.id, Count: len(r.users)}
	if len(r.users) > maxUsers {
		st.Truncated = true
		v.shown = make(map[string]bool, maxUsers)
		for _, u := range users {
			v.shown[u] = true
		}
	}
	st.Members = r.membersLocked(users)
	r.locals[c] = v
	return st
}

// firstUsers returns the n smallest user ids of users, in order: a
// selection, not a sort of them all, as a room of 10,000 shows its first
// 100 to each connection that joins it.
func firstUsers(users map[string]int, n int) []string {
	switch {
	case len(users) <= n:
		return slices.Sorted(maps.Keys(users))
	case n <= 0:
		return nil
	}
	first := make([]string, 0, n+1)
	for u := range users {
		if len(first) == n && u >= first[n-1] {
			continue
		}
		i, _ := slices.BinarySearch(first, u)
		first = slices.Insert(first, i, u)
		if len(first) > n {
			first = first[:n]
		}
	}
	return first
}

// hide stops showing the room to c.
func (r *room) hide(c *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.locals, c)
}

// membersLocked returns the members of the room that are users, in that
// order, each with their connections, oldest first.
func (r *room) membersLocked(users []string) []protocol.RoomMember {
	out := make([]protocol.RoomMember, len(users))
	at := make(map[string]int, len(users))
	for i, u := range users {
		out[i] = protocol.RoomMember{UserID: u, Conns: []protocol.RoomConn{}}
		at[u] = i
	}
	for id, m := range r.members {
		if i, ok := at[m.userID]; ok {
			out[i].Conns = append(out[i].Conns, roomConn(id, m))
		}
	}
	for i := range out {
		slices.SortFunc(out[i].Conns, func(a, b protocol.RoomConn) int {
			return cmp.Or(cmp.Compare(a.Since, b.Since), cmp.Compare(a.ConnID, b.ConnID))
		})
	}
	return out
}

// roomConn returns a member's entry in a frame.
func roomConn(connID string, m *roomMember) protocol.RoomConn {
	meta := m.meta
	if len(meta) == 0 {
		meta = json.RawMessage("{}")
	}
	return protocol.RoomConn{ConnID: connID, Meta: meta, Since: m.since}
}

// takeDiff returns the room_diff of what changed for c since its last
// frame of the room, or nil when nothing did.
func (r *room) takeDiff(c *conn) *protocol.RoomDiff {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v := r.locals[c]
	if v == nil || !v.notified {
		return nil
	}
	// The newest change of each connection it follows is what it is told.
	newest := make(map[string]*roomChange)
	unseen := r.log.since(v.seen)
	for i := range unseen {
		if ch := &unseen[i]; v.shows(ch.userID) {
			newest[ch.connID] = ch
		}
	}
	v.seen, v.notified = r.log.seq, false
	var joins, leaves []*roomChange
	for _, ch := range newest {
		if ch.m != nil {
			joins = append(joins, ch)
		} else {
			leaves = append(leaves, ch)
		}
	}
	return &protocol.RoomDiff{Type: protocol.TypeRoomDiff, Room: r.id, Count: len(r.users),
		Joins: groupByUser(joins), Leaves: groupByUser(leaves)}
}

// groupByUser returns the joins (full entries) or the leaves (connection
// ids only) of a diff as members, by user id.
func groupByUser(changes []*roomChange) []protocol.RoomMember {
	byUser := make(map[string][]protocol.RoomConn)
	for _, ch := range changes {
		e := protocol.RoomConn{ConnID: ch.connID}
		if ch.m != nil {
			e = roomConn(ch.connID, ch.m)
		}
		byUser[ch.userID] = append(byUser[ch.userID], e)
	}
	out := make([]protocol.RoomMember, 0, len(byUser))
	for u, conns := range byUser {
		slices.SortFunc(conns, func(a, b protocol.RoomConn) int { return cmp.Compare(a.ConnID, b.ConnID) })
		out = append(out, protocol.RoomMember{UserID: u, Conns: conns})
	}
	slices.SortFunc(out, func(a, b protocol.RoomMember) int { return cmp.Compare(a.UserID, b.UserID) })
	return out
}

// roomSnapshot is a room as a listing of its keys shows it: the HTTP
// API's answer, which needs no table of its own.
type roomSnapshot struct {
	Room      string                `json:"room"`
	Members   []protocol.RoomMember `json:"members"`
	Count     int                   `json:"count"`
	Truncated bool                  `json:"truncated"`
}

// snapshotOf returns a room's members from a listing of its keys, at most
// maxUsers users (the first by user id, as room_state shows them).
func snapshotOf(roomID string, entries []presence.RoomEntry, maxUsers int) *roomSnapshot {
	r := &room{id: roomID, members: membersOf(entries), users: make(map[string]int)}
	for _, m := range r.members {
		r.users[m.userID]++
	}
	out := &roomSnapshot{Room: roomID, Count: len(r.users), Truncated: len(r.users) > maxUsers}
	out.Members = r.membersLocked(firstUsers(r.users, maxUsers))
	return out
}
