package client

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// MaxRoomMetaBytes is the largest room meta the gateway takes by default,
// in bytes of compact JSON.
const MaxRoomMetaBytes = 1024

// ErrNotJoined is why Typing and Signal send nothing: the room's state has
// not come on the open connection yet (the gateway takes signals only
// after it), or there is no connection. Try again later, or skip it.
var ErrNotJoined = errors.New("not joined on the open connection yet")

// Room is a room as the client knows it: its members, kept from the
// gateway's room_state and room_diff frames.
type Room struct {
	ID string
	// Members are the users in the room, by user id, each with their
	// connections in it, oldest first.
	Members []protocol.RoomMember
	// Count is the number of users in the room, as the gateway counts
	// them; more than len(Members) when Truncated.
	Count int
	// Truncated says the gateway listed only part of a large room.
	Truncated bool
	// Joined says the room's state came on the open connection; false
	// while the client reconnects and joins again.
	Joined bool
}

// room is a room the client is in: its meta, sent again on every new
// connection, and its members (user id -> conn id -> connection).
type room struct {
	meta      json.RawMessage
	members   map[string]map[string]protocol.RoomConn
	count     int
	truncated bool
	joined    bool
}

// roomMeta checks a meta and returns its compact JSON: nil for nil, else a
// JSON object of at most MaxRoomMetaBytes.
func roomMeta(meta any) (json.RawMessage, error) {
	if meta == nil {
		return nil, nil
	}
	data, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	if buf.Len() == 0 || buf.Bytes()[0] != '{' {
		return nil, errors.New("meta: want a JSON object")
	}
	if buf.Len() > MaxRoomMetaBytes {
		return nil, fmt.Errorf("meta: %d bytes of JSON, over %d", buf.Len(), MaxRoomMetaBytes)
	}
	return buf.Bytes(), nil
}

func checkRoomID(id string) error {
	if !presence.ValidRoomID(id) {
		return fmt.Errorf("room id %q: want 1 to %d characters of A-Z a-z 0-9 _ - and :, other than %s",
			id, presence.MaxRoomIDLen, presence.LeaseEndedRoom)
	}
	return nil
}

// Join enters a room with this connection's meta (nil, or a value whose
// JSON is an object of at most MaxRoomMetaBytes: a name, a colour). The
// gateway answers with a RoomState event, or RoomDenied; the room is
// joined again, with the newest meta, on every new connection, and its
// members are kept in Room. Joining a room already joined replaces the
// meta. A join the gateway refuses because too many requests wait (a
// ServerError rate_limited) is sent again shortly. A bad room id or meta
// is an error and nothing is sent.
func (c *Client) Join(roomID string, meta any) error {
	if err := checkRoomID(roomID); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	m, err := roomMeta(meta)
	if err != nil {
		return fmt.Errorf("join %s: %w", roomID, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("join: %w", c.err)
	}
	r, ok := c.rooms[roomID]
	if !ok {
		r = &room{members: make(map[string]map[string]protocol.RoomConn)}
		c.rooms[roomID] = r
	}
	r.meta = m
	c.joinLocked(roomID, r)
	return nil
}

// UpdateRoomMeta replaces this connection's meta in a room it joined; the
// change comes back in a RoomDiff, as to every member. The gateway may
// refuse it with a ServerError rate_limited (too many updates, or
// requests, at once): the client then sends the newest meta again
// itself, shortly, unless a later update or join carries it.
func (c *Client) UpdateRoomMeta(roomID string, meta any) error {
	if err := checkRoomID(roomID); err != nil {
		return fmt.Errorf("update room meta: %w", err)
	}
	m, err := roomMeta(meta)
	if err != nil {
		return fmt.Errorf("update room meta of %s: %w", roomID, err)
	}
	if m == nil {
		return fmt.Errorf("update room meta of %s: no meta", roomID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("update room meta: %w", c.err)
	}
	r, ok := c.rooms[roomID]
	if !ok {
		return fmt.Errorf("update room meta of %s: not joined", roomID)
	}
	r.meta = m
	if !c.foldMetaLocked(roomID, m) {
		c.requestLocked(protocol.ClientMessage{Type: protocol.TypeRoomUpdate, ID: c.nextRoomIDLocked(), Room: roomID, Meta: m})
	}
	return nil
}

// foldMetaLocked puts meta into the room's join or room_update that waits
// in the backlog, if the room's last request there is one, and reports
// whether it did: updates faster than the requests go (a cursor) then
// make one message, not a backlog that grows.
func (c *Client) foldMetaLocked(roomID string, meta json.RawMessage) bool {
	for i := len(c.backlog) - 1; i >= 0; i-- {
		if m := &c.backlog[i]; m.Room == roomID {
			if m.Type != protocol.TypeJoin && m.Type != protocol.TypeRoomUpdate {
				return false
			}
			m.Meta = meta
			return true
		}
	}
	return false
}

// Leave leaves a room; leaving a room not joined does nothing. A leave the
// gateway refuses because too many requests wait (a ServerError
// rate_limited) is sent again shortly, unless the room was joined again
// since.
func (c *Client) Leave(roomID string) error {
	if err := checkRoomID(roomID); err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("leave: %w", c.err)
	}
	if _, ok := c.rooms[roomID]; !ok {
		return nil
	}
	delete(c.rooms, roomID)
	// An id, though leave has no answer, lets a refusal of it be told,
	// and the leave sent again.
	c.requestLocked(protocol.ClientMessage{Type: protocol.TypeLeave, ID: c.nextRoomIDLocked(), Room: roomID})
	return nil
}

// Rooms returns the ids of the rooms joined (and not left or denied),
// sorted.
func (c *Client) Rooms() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.rooms))
}

// Room returns a room joined as the client knows it now, whatever events
// were dropped; false for a room not joined.
func (c *Client) Room(roomID string) (Room, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.rooms[roomID]
	if !ok {
		return Room{}, false
	}
	out := Room{ID: roomID, Count: r.count, Truncated: r.truncated, Joined: r.joined, Members: []protocol.RoomMember{}}
	for _, user := range slices.Sorted(maps.Keys(r.members)) {
		conns := slices.Collect(maps.Values(r.members[user]))
		slices.SortFunc(conns, func(a, b protocol.RoomConn) int {
			return cmp.Or(cmp.Compare(a.Since, b.Since), cmp.Compare(a.ConnID, b.ConnID))
		})
		out.Members = append(out.Members, protocol.RoomMember{UserID: user, Conns: conns})
	}
	return out, true
}

// joinLocked sends the join of r on the open connection.
func (c *Client) joinLocked(roomID string, r *room) {
	r.joined = false
	c.requestLocked(protocol.ClientMessage{Type: protocol.TypeJoin, ID: c.nextRoomIDLocked(), Room: roomID, Meta: r.meta})
}

// rejoinLocked joins every room again on a new connection.
func (c *Client) rejoinLocked() {
	for _, id := range slices.Sorted(maps.Keys(c.rooms)) {
		c.joinLocked(id, c.rooms[id])
	}
}

// roomsLostLocked marks every room as not joined on the lost connection.
func (c *Client) roomsLostLocked() {
	for _, r := range c.rooms {
		r.joined = false
	}
}

func (c *Client) nextRoomIDLocked() string {
	c.seq++
	return "r-" + strconv.FormatUint(c.seq, 10)
}

// roomStateLocked makes a room_state the room's members.
func (c *Client) roomStateLocked(m protocol.RoomState) {
	r, ok := c.rooms[m.Room]
	if !ok {
		return
	}
	r.members = make(map[string]map[string]protocol.RoomConn, len(m.Members))
	addConns(r.members, m.Members)
	r.count, r.truncated, r.joined = m.Count, m.Truncated, true
}

// roomDiffLocked applies a room_diff: the leaves, then the joins (full
// entries, which replace what the client had for their connections). A
// diff before the room's state on this connection is in that state.
func (c *Client) roomDiffLocked(m protocol.RoomDiff) {
	r, ok := c.rooms[m.Room]
	if !ok || !r.joined {
		return
	}
	for _, mb := range m.Leaves {
		conns := r.members[mb.UserID]
		for _, cn := range mb.Conns {
			delete(conns, cn.ConnID)
		}
		if len(conns) == 0 {
			delete(r.members, mb.UserID)
		}
	}
	addConns(r.members, m.Joins)
	r.count = m.Count
}

func addConns(members map[string]map[string]protocol.RoomConn, list []protocol.RoomMember) {
	for _, mb := range list {
		if !presence.ValidUserID(mb.UserID) {
			continue
		}
		for _, cn := range mb.Conns {
			if cn.ConnID == "" {
				continue
			}
			conns := members[mb.UserID]
			if conns == nil {
				conns = make(map[string]protocol.RoomConn)
				members[mb.UserID] = conns
			}
			conns[cn.ConnID] = cn
		}
	}
}

// Typing says the person is typing in a room joined: the others get the
// signal typing, which holds for protocol.SignalExpiresMS. Call it about
// every 2 s while the person types. The gateway rate limits signals (a
// ServerError rate_limited), and closes with 1008, which stops the
// Client, a socket that keeps sending far more messages than its rate
// limit takes (20 a second by default). It returns an error wrapping
// ErrNotJoined when the room is not joined on the open connection.
func (c *Client) Typing(roomID string) error {
	return c.signal(roomID, protocol.ClientMessage{Type: protocol.TypeTyping, Room: roomID})
}

// Signal sends a short-lived signal to the other members of a room joined
// (a cursor, a reaction): a type of 1 to 32 characters of a-z 0-9 _ -,
// and data (nil, or a value whose JSON is at most presence.MaxSignalData
// bytes). The others get it in a RoomSignal event. Signals are rate
// limited as Typing says: a cursor is sent at most a few times a second,
// not on every move. It returns an error wrapping ErrNotJoined when the
// room is not joined on the open connection.
func (c *Client) Signal(roomID, signal string, data any) error {
	if !presence.ValidSignal(signal) {
		return fmt.Errorf("signal %q: want 1 to %d characters of a-z 0-9 _ -", signal, presence.MaxSignalLen)
	}
	m := protocol.ClientMessage{Type: protocol.TypeSignal, Room: roomID, Signal: signal}
	if data != nil {
		raw, err := json.Marshal(data)
		if err != nil {
			return fmt.Errorf("signal %s: data: %w", signal, err)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return fmt.Errorf("signal %s: data: %w", signal, err)
		}
		if buf.Len() > presence.MaxSignalData {
			return fmt.Errorf("signal %s: data of %d bytes of JSON, over %d", signal, buf.Len(), presence.MaxSignalData)
		}
		m.Data = buf.Bytes()
	}
	return c.signal(roomID, m)
}

func (c *Client) signal(roomID string, m protocol.ClientMessage) error {
	if err := checkRoomID(roomID); err != nil {
		return fmt.Errorf("%s: %w", m.Type, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("%s: %w", m.Type, c.err)
	}
	r, ok := c.rooms[roomID]
	switch {
	case !ok:
		return fmt.Errorf("%s in %s: not joined", m.Type, roomID)
	case !r.joined || c.conn == nil:
		return fmt.Errorf("%s in %s: %w", m.Type, roomID, ErrNotJoined)
	}
	// An id tells the signal rate's refusal of it from the message rate
	// limit's, which has none and may have dropped a request
	// (droppedLocked).
	m.ID = c.nextRoomIDLocked()
	c.sendLocked(m)
	return nil
}
