package client

import (
	"time"

	"github.com/greendot/greendot/pkg/protocol"
)

// Event is what a Client delivers on its Events channel: one of
// Connected, Reconnected, Disconnected, Snapshot, Changes, Self, Denied,
// RoomState, RoomDiff, RoomSignal, RoomDenied, ServerError and Lagged. A type switch reads them:
//
//	for ev := range c.Events() {
//		switch ev := ev.(type) {
//		case client.Changes:
//			for _, p := range ev.Updates { ... }
//		case client.Reconnected:
//			...
//		}
//	}
type Event interface{ event() }

// Connected is the first event: the gateway's hello on the first
// connection.
type Connected struct{ protocol.Hello }

// Reconnected says a new connection replaced a lost one: its hello, after
// the client sent its chosen status, idle state and subscriptions again.
// The Snapshot answers to those subscriptions follow.
type Reconnected struct {
	protocol.Hello
	// Attempts is how many connection attempts it took.
	Attempts int
	// Down is how long the client was without a connection.
	Down time.Duration
}

// Disconnected says the connection was lost, or an attempt to open a new
// one failed, and when the next attempt is.
type Disconnected struct {
	// Err is why: a *CloseError when the gateway closed the socket, a
	// *HandshakeError when it refused the upgrade, or a network error.
	Err error
	// Retry is the wait before the next attempt.
	Retry time.Duration
	// Attempt counts the failed attempts since the last connection; 0
	// when the connection was just lost.
	Attempt int
}

// Snapshot answers a subscribe (presence_init): the current presence of
// every allowed target. ID is the id of the subscribe message the client
// sent for it.
type Snapshot struct{ protocol.PresenceInit }

// Changes carries coalesced changes of watched users (presence_batch).
type Changes struct{ protocol.PresenceBatch }

// Self is the user's own true status and number of live connections,
// across all of their devices, and their custom status.
type Self struct{ protocol.Self }

// Denied is a refused subscription, as an answer to a subscribe or later,
// when the user may no longer watch the target. The client stops watching
// that user (UserID "*": stops watching everyone).
type Denied struct{ protocol.Denied }

// RoomState answers a join (and every join again after a reconnect): the
// room's members now. Client.Room keeps them.
type RoomState struct{ protocol.RoomState }

// RoomDiff carries what changed in a room joined: connections that
// joined or changed their meta, and connections that left.
type RoomDiff struct{ protocol.RoomDiff }

// RoomSignal carries signals of other connections in a room joined
// (typing, and those sent with Signal): the newest of each connection and
// type, each holding for its ExpiresMS unless it comes again.
type RoomSignal struct{ protocol.RoomSignal }

// RoomDenied refuses a join, or ends a membership an auth renewal no
// longer allows; the client is no longer in the room.
type RoomDenied struct{ protocol.RoomDenied }

// ServerError is an error frame: the gateway refused a message; the
// connection stays open. Code is one of protocol's Code constants.
type ServerError struct{ protocol.Error }

// Lagged says the caller read the events too slowly: Dropped events did
// not fit in the channel and were dropped, and this comes in their place.
// The presence of every watched user is still current in Client.Presence,
// which is the way to catch up.
type Lagged struct {
	Dropped uint64
}

func (Connected) event()    {}
func (Reconnected) event()  {}
func (Disconnected) event() {}
func (Snapshot) event()     {}
func (Changes) event()      {}
func (Self) event()         {}
func (Denied) event()       {}
func (RoomState) event()    {}
func (RoomDiff) event()     {}
func (RoomSignal) event()   {}
func (RoomDenied) event()   {}
func (ServerError) event()  {}
func (Lagged) event()       {}

// hello converts a decoded hello frame.
func hello(m protocol.ServerMessage) protocol.Hello {
	return protocol.Hello{
		Type:                m.Type,
		UserID:              m.UserID,
		ConnID:              m.ConnID,
		HeartbeatIntervalMS: m.HeartbeatIntervalMS,
		TTLMS:               m.TTLMS,
		Status:              m.Status,
	}
}

// serverEvent converts a server message after hello to its event; ok is
// false for a type this client does not know (from a newer gateway), which
// is ignored.
func serverEvent(m protocol.ServerMessage) (ev Event, ok bool) {
	switch m.Type {
	case protocol.TypePresenceInit:
		return Snapshot{protocol.PresenceInit{Type: m.Type, ID: m.ID, Users: m.Users, OnlineCount: m.OnlineCount}}, true
	case protocol.TypePresenceBatch:
		return Changes{protocol.PresenceBatch{Type: m.Type, Updates: m.Updates}}, true
	case protocol.TypeSelf:
		return Self{protocol.Self{Type: m.Type, Status: m.Status, Devices: m.Devices, Custom: m.Custom}}, true
	case protocol.TypeDenied:
		return Denied{protocol.Denied{Type: m.Type, ID: m.ID, UserID: m.UserID, Reason: m.Reason}}, true
	case protocol.TypeRoomState:
		return RoomState{protocol.RoomState{Type: m.Type, ID: m.ID, Room: m.Room, Members: m.Members, Count: m.Count, Truncated: m.Truncated}}, true
	case protocol.TypeRoomDiff:
		return RoomDiff{protocol.RoomDiff{Type: m.Type, Room: m.Room, Joins: m.Joins, Leaves: m.Leaves, Count: m.Count}}, true
	case protocol.TypeRoomSignal:
		return RoomSignal{protocol.RoomSignal{Type: m.Type, Room: m.Room, Signals: m.Signals}}, true
	case protocol.TypeRoomDenied:
		return RoomDenied{protocol.RoomDenied{Type: m.Type, ID: m.ID, Room: m.Room, Reason: m.Reason}}, true
	case protocol.TypeError:
		return ServerError{protocol.Error{Type: m.Type, ID: m.ID, Code: m.Code, Message: m.Message}}, true
	}
	return nil, false
}
