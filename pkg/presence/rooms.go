package presence

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// RoomValue is the value of a member's key in RoomsBucket: the meta its
// connection gave when it joined the room (or last changed it), a JSON
// object, and when it joined (unix ms).
type RoomValue struct {
	Meta  json.RawMessage `json:"meta"`
	Since int64           `json:"since"`
}

// The operations of a RoomEvent.
const (
	RoomJoin   = "join"
	RoomUpdate = "update"
	RoomLeave  = "leave"
)

// RoomEvent is what the writer of a room key publishes on the room's
// subject (RoomSubject) right after the write: a connection joined, changed
// its meta, or left. Rev is the key's revision in RoomsBucket (of the
// delete, for a leave by its gateway; of the key removed, for a leave by a
// reaper): a member's events apply in the order of their revisions.
type RoomEvent struct {
	Room    string          `json:"room"`
	Op      string          `json:"op"`
	UserID  string          `json:"user_id"`
	ConnID  string          `json:"conn_id"`
	Gateway string          `json:"gateway"`
	Epoch   string          `json:"epoch"`
	Meta    json.RawMessage `json:"meta,omitempty"`
	Since   int64           `json:"since,omitempty"`
	Rev     uint64          `json:"rev"`
}

// Member returns the member the event is about.
func (e *RoomEvent) Member() RoomMember {
	return RoomMember{Room: e.Room, Gateway: e.Gateway, Epoch: e.Epoch, UserID: e.UserID, ConnID: e.ConnID}
}

// RoomLeaseEnded is published on RoomLeaseEndedSubject by a reaper once it
// removed every room key held under a lease that ended.
type RoomLeaseEnded struct {
	Gateway string `json:"gateway"`
	Epoch   string `json:"epoch"`
}

// RoomSignal is what a gateway publishes on a room's signal subject
// (RoomSignalSubject) for a connection in the room: typing, and the like.
// Signals are never stored.
type RoomSignal struct {
	Room    string          `json:"room"`
	UserID  string          `json:"user_id"`
	ConnID  string          `json:"conn_id"`
	Gateway string          `json:"gateway"`
	Signal  string          `json:"signal"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// MaxSignalLen is the longest signal type accepted, and MaxSignalData the
// most bytes of a signal's data.
const (
	MaxSignalLen  = 32
	MaxSignalData = 256
)

// ValidSignal reports whether s is a signal type: 1 to 32 characters of
// a-z 0-9 _ -.
func ValidSignal(s string) bool {
	if len(s) == 0 || len(s) > MaxSignalLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// RoomEntry is a member's key as listed: the member, its value and the
// key's revision.
type RoomEntry struct {
	Member RoomMember
	Value  RoomValue
	Rev    uint64
}

// PutRoomMember writes a member's key and returns its revision.
func (s *Store) PutRoomMember(ctx context.Context, m RoomMember, v RoomValue) (uint64, error) {
	data, err := json.Marshal(&v)
	if err != nil {
		return 0, err
	}
	rev, err := s.rooms.Put(ctx, m.Key(), data)
	if err != nil {
		return 0, fmt.Errorf("write room key %q: %w", m.Key(), err)
	}
	return rev, nil
}

// DeleteRoomMember deletes a member's key, as a KV delete does (watchers
// of the bucket see it), and returns the revision of the delete. The
// delete marker expires after the bucket's marker TTL, so that members
// that come and go leave nothing behind.
func (s *Store) DeleteRoomMember(ctx context.Context, m RoomMember) (uint64, error) {
	ack, err := s.js.PublishMsg(ctx, deleteMsg(RoomsBucket, m.Key()), jetstream.WithMsgTTL(s.opts.markerTTL()))
	if err != nil {
		return 0, fmt.Errorf("delete room key %q: %w", m.Key(), err)
	}
	return ack.Sequence, nil
}

// RoomMembers lists the members of a room. Like a scan, it may miss a key
// written while it runs; a member may be listed twice (see list).
func (s *Store) RoomMembers(ctx context.Context, roomID string) ([]RoomEntry, error) {
	out, err := s.listRooms(ctx, RoomKeysFilter(roomID))
	if err != nil {
		return nil, fmt.Errorf("members of room %q: %w", roomID, err)
	}
	return out, nil
}

// LeaseRoomKeys lists the room keys written under a lease.
func (s *Store) LeaseRoomKeys(ctx context.Context, gatewayID, epoch string) ([]RoomEntry, error) {
	out, err := s.listRooms(ctx, LeaseRoomKeysFilter(gatewayID, epoch))
	if err != nil {
		return nil, fmt.Errorf("room keys of lease %s: %w", LeaseKey(gatewayID, epoch), err)
	}
	return out, nil
}

// ScanRoomKeys lists every room key (see scan).
func (s *Store) ScanRoomKeys(ctx context.Context) ([]RoomEntry, error) {
	return s.listRooms(ctx, ">")
}

// listRooms lists the room keys matching filter, each once, with their
// newest value.
func (s *Store) listRooms(ctx context.Context, filter string) ([]RoomEntry, error) {
	at := make(map[RoomMember]int)
	var out []RoomEntry
	err := s.list(ctx, s.rooms, []string{filter}, func(e jetstream.KeyValueEntry) error {
		m, ok := ParseRoomKey(e.Key())
		var v RoomValue
		if !ok || json.Unmarshal(e.Value(), &v) != nil {
			return nil
		}
		entry := RoomEntry{Member: m, Value: v, Rev: e.Revision()}
		if i, seen := at[m]; seen {
			if entry.Rev > out[i].Rev {
				out[i] = entry
			}
			return nil
		}
		at[m] = len(out)
		out = append(out, entry)
		return nil
	})
	return out, err
}

// PurgeLeaseRooms removes every room key written under a lease in one
// request (a purge of the stream by subject, which leaves no marker): what
// a reaper does once it has told the rooms.
func (s *Store) PurgeLeaseRooms(ctx context.Context, gatewayID, epoch string) error {
	subject := KeySubject(RoomsBucket, LeaseRoomKeysFilter(gatewayID, epoch))
	st, err := s.js.Stream(ctx, StreamName(RoomsBucket))
	if err != nil {
		return fmt.Errorf("remove %s: %w", subject, err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return fmt.Errorf("remove %s: %w", subject, err)
	}
	return nil
}
