package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// memberships is the part of the gateway that puts its connections in
// rooms: it handles their join, room_update, leave, typing and signal
// messages, has each connection's keys in presence_rooms say what they
// must (writeKeys), and writes the connections' room frames. The rooms'
// member tables are the hub's. It is safe for concurrent use.
type memberships struct {
	frames
	cfg      Config
	nc       *nats.Conn
	hub      *roomHub
	registry *registry
	// enqueue queues a request of a connection, in order with its
	// others, and reports false when too many wait (Service.enqueue).
	enqueue func(c *conn, fn func(context.Context)) bool

	// Set by opened, once the buckets are open and the lease is made.
	store *presence.Store
	keys  *registrar

	// count is the rooms joined by the gateway's connections, for the
	// metrics.
	count atomic.Int64
}

// opened gives the part, and the hub, the buckets and the registrar,
// whose lease its keys are written under; before any connection is
// served.
func (ms *memberships) opened(store *presence.Store, keys *registrar) {
	ms.store, ms.keys = store, keys
	ms.hub.store = store
}

// connRooms are the rooms a connection joined, and its writer of their
// keys in presence_rooms. A key is written, under the gateway's lease,
// while the connection is in the room and its user is not invisible, and
// deleted otherwise; the writer runs only while the keys differ from
// that, and publishes each write's event on the room's subject at once.
type connRooms struct {
	mu     sync.Mutex
	joined map[string]*joinedRoom
	// invisible mirrors the user's status, as of status revision
	// statusRev: an invisible user's connections have no keys.
	statusRev uint64
	invisible bool
	// ended is set once the connection ended for good (after the offline
	// grace of a clean close): its keys go.
	ended   bool
	running bool
	// turn is held by a join and by a revocation while they run: a
	// revocation run outside the connection's queue (an auth renewal that
	// found it full) waits for a join under way, which could otherwise
	// add a room after the revocation looked, or show one it took away.
	turn sync.Mutex
}

// joinedRoom is one room of a connection, and what its key says.
type joinedRoom struct {
	room  *room
	meta  json.RawMessage
	since int64
	gen   uint64 // counts the changes of meta
	left  bool   // the client left: the key goes, then the entry
	// epoch is the lease the key is written under ("" while there is no
	// key) and written the gen it says.
	epoch   string
	written uint64
	// changed is closed and replaced after each write.
	changed chan struct{}
}

// countLocked returns how many rooms the connection is in.
func (rs *connRooms) countLocked() int {
	n := 0
	for _, jr := range rs.joined {
		if !jr.left {
			n++
		}
	}
	return n
}

// roomsChanged tells the scheduler that room frames wait for c.
func (c *conn) roomsChanged() {
	if c.box.AddRooms() {
		c.schedule()
	}
}

// joinedRooms returns the tables of the rooms c is shown.
func (c *conn) joinedRooms() []*room {
	c.rooms.mu.Lock()
	defer c.rooms.mu.Unlock()
	out := make([]*room, 0, len(c.rooms.joined))
	for _, jr := range c.rooms.joined {
		if !jr.left {
			out = append(out, jr.room)
		}
	}
	return out
}

// flush writes a room_diff for each room of c that changed, and a
// room_signal for each with signals waiting for c; buf is scratch space,
// returned for reuse. The caller holds the socket's write lock. It stops
// at the first write that fails, which ends c.
func (ms *memberships) flush(c *conn, buf []byte) []byte {
	for _, r := range c.joinedRooms() {
		if d := r.takeDiff(c); d != nil {
			data, err := json.Marshal(d)
			if err != nil {
				ms.log.Error("encode room_diff", "room", r.id, "err", err)
			} else if !ms.writeFrame(c, data, ms.metrics.sentRoomDiff) {
				return buf
			}
		}
		var ok bool
		if buf, ok = r.appendSignals(buf[:0], c); ok && !ms.writeFrame(c, buf, ms.metrics.sentRoomSignal) {
			return buf
		}
	}
	return buf
}

// writeFrame writes one room frame, counted in sent, and reports
// whether it was written; the caller holds the socket's write lock.
func (ms *memberships) writeFrame(c *conn, data []byte, sent prometheus.Counter) bool {
	if !c.writeLocked(data) {
		return false
	}
	sent.Inc()
	return true
}

// check answers a room message whose room id is not one, or not
// allowed, with room_denied; it reports whether the room is fine. While
// an auth renewal before it waits its turn, the grant it will bring is
// not known yet: the join checks it when it runs.
func (ms *memberships) check(c *conn, m *protocol.ClientMessage) bool {
	reason := ""
	switch {
	case !presence.ValidRoomID(m.Room):
		reason = protocol.ReasonInvalidRoom
	case !c.roomGrant.Load().allows(m.Room) && !c.renewalWaits():
		reason = protocol.ReasonNotAllowed
	default:
		return true
	}
	ms.deny(c, m.ID, m.Room, reason)
	return false
}

// meta returns a message's meta as stored: a JSON object ({} when
// there is none), compacted, at most RoomMetaMax bytes.
func (ms *memberships) meta(raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}"), nil
	}
	if raw[0] != '{' {
		return nil, errors.New(`field "meta" must be a JSON object`)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, errors.New(`field "meta" must be a JSON object`)
	}
	if buf.Len() > ms.cfg.RoomMetaMax {
		return nil, fmt.Errorf(`field "meta" is %d bytes: at most %d (--room-meta-max)`, buf.Len(), ms.cfg.RoomMetaMax)
	}
	return buf.Bytes(), nil
}

// queue queues a room request for c, in order with its others, or
// refuses it when too many wait.
func (ms *memberships) queue(c *conn, id string, fn func(context.Context)) {
	if !ms.enqueue(c, fn) {
		ms.metrics.msgsIn.WithLabelValues("rate_limited").Inc()
		ms.sendError(c, id, protocol.CodeRateLimited, fmt.Sprintf("too many requests in progress: at most %d wait for an answer", maxQueued))
	}
}

// joinMessage handles join: it checks the room and the meta, and queues
// the join.
func (ms *memberships) joinMessage(c *conn, m *protocol.ClientMessage) {
	if !ms.check(c, m) {
		return
	}
	meta, err := ms.meta(m.Meta)
	if err != nil {
		ms.sendError(c, m.ID, protocol.CodeBadRequest, err.Error())
		return
	}
	id, roomID := m.ID, m.Room
	ms.queue(c, id, func(ctx context.Context) { ms.join(ctx, c, id, roomID, meta) })
}

// join makes c a member of a room (or changes its meta there), waits for
// its key, and answers with the room's state; or answers room_denied if
// c's grant no longer allows the room.
func (ms *memberships) join(ctx context.Context, c *conn, id, roomID string, meta json.RawMessage) {
	c.rooms.turn.Lock()
	defer c.rooms.turn.Unlock()
	// The grant was checked when the join was queued; an auth renewal may
	// have replaced it since, and its revocation may have run already.
	if !c.roomGrant.Load().allows(roomID) {
		ms.deny(c, id, roomID, protocol.ReasonNotAllowed)
		return
	}
	jr, gen, err := ms.joinedRoom(ctx, c, id, roomID, meta)
	if err != nil || jr == nil {
		ms.reply(c, id, err)
		return
	}
	ms.awaitKey(ctx, c, jr, gen)
	c.box.Hold()
	defer c.release()
	st := jr.room.show(c, id, ms.cfg.RoomMembersMax)
	if !c.open() {
		jr.room.hide(c) // ended meanwhile: hide may have run before show
		return
	}
	ms.send(c, protocol.TypeRoomState, st)
	ms.metrics.roomFrames.WithLabelValues(protocol.TypeRoomState).Inc()
}

// joinedRoom sets c's meta in a room, making c's entry of the room (and
// acquiring the room's table) if c is not in it, and has the writer write
// the key; it returns the entry and the meta change to wait for. It
// returns nil, after a room_denied, when c is in as many rooms as it may
// be. The entry is changed under the same lock that finds it: the writer
// may drop a left room's entry at any moment.
func (ms *memberships) joinedRoom(ctx context.Context, c *conn, id, roomID string, meta json.RawMessage) (*joinedRoom, uint64, error) {
	c.rooms.mu.Lock()
	if jr := c.rooms.joined[roomID]; jr != nil && !jr.left {
		defer c.rooms.mu.Unlock()
		return jr, ms.setMetaLocked(c, jr, meta), nil
	}
	full := c.rooms.countLocked() >= ms.cfg.MaxRoomsPerConn
	c.rooms.mu.Unlock()
	if full {
		ms.deny(c, id, roomID, protocol.ReasonTooManyRooms)
		return nil, 0, nil
	}
	r, err := ms.hub.acquire(ctx, roomID)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: room %q: %v", ErrUnavailable, roomID, err)
	}
	c.rooms.mu.Lock()
	defer c.rooms.mu.Unlock()
	if c.rooms.ended || !c.open() {
		ms.hub.release(r)
		return nil, 0, nil
	}
	jr := c.rooms.joined[roomID]
	if jr != nil {
		// Left, and its key not yet gone: it is joined again as it is.
		ms.hub.release(r)
		jr.left, jr.since = false, 0
	} else {
		if c.rooms.joined == nil {
			c.rooms.joined = make(map[string]*joinedRoom)
		}
		jr = &joinedRoom{room: r, changed: make(chan struct{})}
		c.rooms.joined[roomID] = jr
		ms.count.Add(1)
	}
	return jr, ms.setMetaLocked(c, jr, meta), nil
}

// setMetaLocked sets c's meta in a room joined, has the writer write
// it, and returns the change's number; the caller holds c.rooms.mu.
func (ms *memberships) setMetaLocked(c *conn, jr *joinedRoom, meta json.RawMessage) uint64 {
	if jr.since == 0 {
		jr.since = time.Now().UnixMilli()
	}
	jr.meta = meta
	jr.gen++
	ms.kickLocked(c)
	return jr.gen
}

// awaitKey waits until c's key in a room says meta change gen, or
// there is to be no key (invisible user), or ctx ends: then the room's
// state is shown without it, and a room_diff brings it once written.
func (ms *memberships) awaitKey(ctx context.Context, c *conn, jr *joinedRoom, gen uint64) {
	for {
		c.rooms.mu.Lock()
		done := jr.written >= gen && jr.epoch != "" || c.rooms.invisible || c.rooms.ended || jr.left
		ch := jr.changed
		c.rooms.mu.Unlock()
		if done || !c.open() {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// updateMessage handles room_update: rate limited, then queued.
func (ms *memberships) updateMessage(c *conn, m *protocol.ClientMessage, now int64) {
	if !c.roomLimiter.Allow(now, ms.cfg.RoomUpdateRate, ms.cfg.RoomUpdateBurst) {
		ms.metrics.msgsIn.WithLabelValues("rate_limited").Inc()
		ms.sendError(c, m.ID, protocol.CodeRateLimited, fmt.Sprintf("too many room updates: at most %g per second (--room-update-rate)", ms.cfg.RoomUpdateRate))
		return
	}
	if !presence.ValidRoomID(m.Room) {
		ms.sendError(c, m.ID, protocol.CodeBadRequest, fmt.Sprintf("room_update needs the \"room\" of a room joined; %q is not a room id", m.Room))
		return
	}
	// Unlike join's, room_update's meta is required: a misspelt field
	// would otherwise wipe the member's meta for everyone.
	if raw := bytes.TrimSpace(m.Meta); len(raw) == 0 || string(raw) == "null" {
		ms.sendError(c, m.ID, protocol.CodeBadRequest, `room_update needs the field "meta": a JSON object, {} for none`)
		return
	}
	meta, err := ms.meta(m.Meta)
	if err != nil {
		ms.sendError(c, m.ID, protocol.CodeBadRequest, err.Error())
		return
	}
	id, roomID := m.ID, m.Room
	ms.queue(c, id, func(context.Context) { ms.update(c, id, roomID, meta) })
}

// update replaces c's meta in a room it joined; it has no answer.
func (ms *memberships) update(c *conn, id, roomID string, meta json.RawMessage) {
	c.rooms.mu.Lock()
	jr := c.rooms.joined[roomID]
	if jr == nil || jr.left {
		c.rooms.mu.Unlock()
		ms.sendError(c, id, protocol.CodeBadRequest, fmt.Sprintf("not in room %q: join it first", roomID))
		return
	}
	ms.setMetaLocked(c, jr, meta)
	c.rooms.mu.Unlock()
}

// leaveMessage handles leave: queued, in order with joins.
func (ms *memberships) leaveMessage(c *conn, m *protocol.ClientMessage) {
	if !presence.ValidRoomID(m.Room) {
		ms.sendError(c, m.ID, protocol.CodeBadRequest, fmt.Sprintf("leave needs the \"room\" to leave; %q is not a room id", m.Room))
		return
	}
	roomID := m.Room
	ms.queue(c, m.ID, func(context.Context) { ms.leave(c, roomID) })
}

// leave takes c out of a room: no more frames of it, and its key
// goes. Leaving a room not joined does nothing.
func (ms *memberships) leave(c *conn, roomID string) {
	c.rooms.mu.Lock()
	jr := c.rooms.joined[roomID]
	if jr == nil || jr.left {
		c.rooms.mu.Unlock()
		return
	}
	jr.left = true
	ms.kickLocked(c)
	c.rooms.mu.Unlock()
	jr.room.hide(c)
}

// revoke takes c out of the rooms its grant no longer allows, each
// with a room_denied frame (no id): an auth renewal replaced the grant.
func (ms *memberships) revoke(c *conn) {
	c.rooms.turn.Lock()
	defer c.rooms.turn.Unlock()
	grant := c.roomGrant.Load()
	c.rooms.mu.Lock()
	var revoked []string
	for id, jr := range c.rooms.joined {
		if !jr.left && !grant.allows(id) {
			revoked = append(revoked, id)
		}
	}
	c.rooms.mu.Unlock()
	for _, id := range revoked {
		ms.leave(c, id)
		ms.deny(c, "", id, protocol.ReasonNotAllowed)
	}
}

// deny writes a room_denied frame.
func (ms *memberships) deny(c *conn, id, roomID, reason string) {
	ms.send(c, protocol.TypeRoomDenied, &protocol.RoomDenied{Type: protocol.TypeRoomDenied, ID: id, Room: roomID, Reason: reason})
	ms.metrics.roomFrames.WithLabelValues(protocol.TypeRoomDenied).Inc()
}

// hide stops every room frame to c, whose socket closed; its keys
// stay until it ends (end).
func (ms *memberships) hide(c *conn) {
	for _, r := range c.joinedRooms() {
		r.hide(c)
	}
}

// end has c's keys go: the connection ended for good.
func (ms *memberships) end(c *conn) {
	c.rooms.mu.Lock()
	defer c.rooms.mu.Unlock()
	if c.rooms.ended || len(c.rooms.joined) == 0 {
		c.rooms.ended = true
		return
	}
	c.rooms.ended = true
	ms.kickLocked(c)
}

// status takes the true status of c's user at status revision rev:
// an invisible user's keys go, and come back when they are visible.
func (ms *memberships) status(c *conn, rev uint64, status presence.Status) {
	c.rooms.mu.Lock()
	defer c.rooms.mu.Unlock()
	if rev <= c.rooms.statusRev {
		return
	}
	c.rooms.statusRev = rev
	if inv := status == presence.Invisible; inv != c.rooms.invisible {
		c.rooms.invisible = inv
		if len(c.rooms.joined) > 0 {
			ms.kickLocked(c)
		}
	}
}

// kickAll has every connection's keys written again: a new lease
// was taken.
func (ms *memberships) kickAll() {
	ms.registry.each(func(c *conn) {
		c.rooms.mu.Lock()
		if len(c.rooms.joined) > 0 {
			ms.kickLocked(c)
		}
		c.rooms.mu.Unlock()
	})
}

// kickLocked starts c's room writer unless it runs; the caller
// holds c.rooms.mu.
func (ms *memberships) kickLocked(c *conn) {
	if c.rooms.running {
		return
	}
	c.rooms.running = true
	if !ms.keys.tasks.Go(func() { ms.writeKeys(c) }) {
		c.rooms.running = false
	}
}
