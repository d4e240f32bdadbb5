// Package protocol holds the messages of greendot's client protocol
// (docs/protocol.md): what a client sends, what the gateway answers, the
// error codes, denial reasons and close codes, and their JSON encoding.
//
// The gateway, the load generator and the tests all use it, so there is one
// definition of every message.
package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/greendot/greendot/pkg/presence"
)

// Client message types.
const (
	TypeHeartbeat   = "heartbeat"
	TypeActivity    = "activity"
	TypeIdle        = "idle"
	TypeBackground  = "background"
	TypeAuth        = "auth"
	TypeSetStatus   = "set_status"
	TypeSetCustom   = "set_custom_status"
	TypeSubscribe   = "subscribe"
	TypeUnsubscribe = "unsubscribe"
	TypeJoin        = "join"
	TypeRoomUpdate  = "room_update"
	TypeLeave       = "leave"
	TypeTyping      = "typing"
	TypeSignal      = "signal"
)

// KnownClientType reports whether t is a client message type of the
// protocol.
func KnownClientType(t string) bool {
	switch t {
	case TypeHeartbeat, TypeActivity, TypeIdle, TypeBackground, TypeAuth, TypeSetStatus, TypeSetCustom, TypeSubscribe, TypeUnsubscribe,
		TypeJoin, TypeRoomUpdate, TypeLeave, TypeTyping, TypeSignal:
		return true
	}
	return false
}

// Server message types.
const (
	TypeHello         = "hello"
	TypePresenceInit  = "presence_init"
	TypePresenceBatch = "presence_batch"
	TypeSelf          = "self"
	TypeDenied        = "denied"
	TypeError         = "error"
	TypeRoomState     = "room_state"
	TypeRoomDiff      = "room_diff"
	TypeRoomDenied    = "room_denied"
	TypeRoomSignal    = "room_signal"
)

// Error codes of error frames.
const (
	CodeBadRequest    = "bad_request"
	CodeUnknownType   = "unknown_type"
	CodeInvalidStatus = "invalid_status"
	CodeInvalidCustom = "invalid_custom_status"
	CodeRateLimited   = "rate_limited"
	CodeUnauthorized  = "unauthorized"
	CodeUnavailable   = "unavailable" // the gateway could not reach its state store; try again
)

// Reasons of denied frames.
const (
	ReasonNotMutualFollowers   = "not_mutual_followers"
	ReasonNotFollowing         = "not_following"
	ReasonTooManySubscriptions = "too_many_subscriptions"
	ReasonInvalidUserID        = "invalid_user_id"
	ReasonNotAllowed           = "not_allowed"
	// ReasonAuthorizationUnavailable: the app, asked whether the watcher
	// may watch the target, did not answer in time or answered badly; the
	// subscription is refused, never allowed by default.
	ReasonAuthorizationUnavailable = "authorization_unavailable"
	// ReasonInvalidRoom and ReasonTooManyRooms refuse a join (room_denied);
	// so does ReasonNotAllowed.
	ReasonInvalidRoom  = "invalid_room"
	ReasonTooManyRooms = "too_many_rooms"
)

// WebSocket close codes the gateway uses.
const (
	CloseNormal         = 1000
	CloseGoingAway      = 1001 // the gateway is draining: reconnect, with jitter
	CloseProtocolError  = 1002
	CloseUnsupported    = 1003 // a binary frame was sent
	ClosePolicy         = 1008 // abuse beyond rate limits, or an expired token
	CloseTooBig         = 1009 // a frame over the size limit
	CloseInternalError  = 1011
	CloseServiceRestart = 1012
)

// ClientMessage is any message a client sends. Fields a type does not use
// are ignored, as are unknown fields.
type ClientMessage struct {
	Type    string   `json:"type"`
	ID      string   `json:"id,omitempty"`
	Status  string   `json:"status,omitempty"`
	UserIDs []string `json:"user_ids,omitempty"`
	All     bool     `json:"all,omitempty"`
	Token   string   `json:"token,omitempty"`
	// Room and Meta are those of join, room_update and leave.
	Room string          `json:"room,omitempty"`
	Meta json.RawMessage `json:"meta,omitempty"`
	// Signal and Data are those of signal.
	Signal string          `json:"signal,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
	// GraceMS is background's grace, in milliseconds; nil for the
	// gateway's.
	GraceMS *int64 `json:"grace_ms,omitempty"`
	// Text, Emoji and ExpiresAt are those of set_custom_status.
	Text      string `json:"text,omitempty"`
	Emoji     string `json:"emoji,omitempty"`
	ExpiresAt int64  `json:"expires_at,omitempty"`
}

// heartbeatJSON is a heartbeat message in its usual form.
const heartbeatJSON = `{"type":"heartbeat"}`

// IsHeartbeat reports whether data is a heartbeat message in its usual
// form, {"type":"heartbeat"}, possibly with surrounding white space: what
// DecodeClient decodes to a ClientMessage with only Type set to
// TypeHeartbeat. A heartbeat written another way decodes the same with
// DecodeClient; this only lets the most frequent message skip the
// decoding. It does not allocate.
func IsHeartbeat(data []byte) bool {
	return string(bytes.TrimSpace(data)) == heartbeatJSON
}

// ErrBadRequest wraps every reason a client message cannot be decoded.
var ErrBadRequest = errors.New("bad request")

// DecodeClient decodes one client message into m, which it resets first. It
// wraps ErrBadRequest when data is not a JSON object with a string "type"
// and correctly typed known fields.
func DecodeClient(data []byte, m *ClientMessage) error {
	*m = ClientMessage{}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return fmt.Errorf("%w: a message is a JSON object", ErrBadRequest)
	}
	// The messages a client sends most (a heartbeat per socket per
	// interval) skip the JSON decoder when written in their usual form;
	// the result is the same.
	switch string(data) {
	case heartbeatJSON:
		m.Type = TypeHeartbeat
		return nil
	case `{"type":"activity"}`:
		m.Type = TypeActivity
		return nil
	case `{"type":"idle"}`:
		m.Type = TypeIdle
		return nil
	}
	if err := json.Unmarshal(data, m); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("%w: field %q must be %s", ErrBadRequest, te.Field, jsonKind(te.Field))
		}
		return fmt.Errorf("%w: invalid JSON", ErrBadRequest)
	}
	if m.Type == "" {
		return fmt.Errorf("%w: missing string field \"type\"", ErrBadRequest)
	}
	return nil
}

func jsonKind(field string) string {
	switch field {
	case "user_ids":
		return "an array of strings"
	case "all":
		return "a boolean"
	case "meta":
		return "a JSON object"
	case "data":
		return "JSON"
	case "grace_ms":
		return "a whole number of milliseconds"
	case "expires_at":
		return "a whole number of unix seconds"
	default:
		return "a string"
	}
}

// Hello is the first frame after the upgrade.
type Hello struct {
	Type                string          `json:"type"`
	UserID              string          `json:"user_id"`
	ConnID              string          `json:"conn_id"`
	HeartbeatIntervalMS int64           `json:"heartbeat_interval_ms"`
	TTLMS               int64           `json:"ttl_ms"`
	Status              presence.Status `json:"status"`
}

// PresenceInit answers subscribe with the current state of every allowed
// target.
type PresenceInit struct {
	Type        string              `json:"type"`
	ID          string              `json:"id,omitempty"`
	Users       []presence.Presence `json:"users"`
	OnlineCount *int                `json:"online_count,omitempty"`
}

// PresenceBatch carries coalesced changes of watched users.
type PresenceBatch struct {
	Type    string              `json:"type"`
	Updates []presence.Presence `json:"updates"`
}

// Self tells all of a user's connections their own true status.
type Self struct {
	Type    string           `json:"type"`
	Status  presence.Status  `json:"status"`
	Devices int              `json:"devices"`
	Custom  *presence.Custom `json:"custom_status,omitempty"`
}

// Denied refuses one subscription.
type Denied struct {
	Type   string `json:"type"`
	ID     string `json:"id,omitempty"`
	UserID string `json:"user_id"`
	Reason string `json:"reason"`
}

// Error answers a bad client message.
type Error struct {
	Type    string `json:"type"`
	ID      string `json:"id,omitempty"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// RoomConn is one connection of a room member: its meta (a JSON object)
// and when it joined (unix ms). A leave carries only the conn_id.
type RoomConn struct {
	ConnID string          `json:"conn_id"`
	Meta   json.RawMessage `json:"meta,omitempty"`
	Since  int64           `json:"since,omitempty"`
}

// RoomMember is a user in a room, with their connections in it.
type RoomMember struct {
	UserID string     `json:"user_id"`
	Conns  []RoomConn `json:"conns"`
}

// RoomState answers join with the room's members.
type RoomState struct {
	Type      string       `json:"type"`
	ID        string       `json:"id,omitempty"`
	Room      string       `json:"room"`
	Members   []RoomMember `json:"members"`
	Count     int          `json:"count"`
	Truncated bool         `json:"truncated"`
}

// RoomDiff carries a room's changes since the socket's last frame of it.
type RoomDiff struct {
	Type   string       `json:"type"`
	Room   string       `json:"room"`
	Joins  []RoomMember `json:"joins"`
	Leaves []RoomMember `json:"leaves"`
	Count  int          `json:"count"`
}

// SignalTyping is the signal a typing message sends.
const SignalTyping = "typing"

// SignalExpiresMS is how long a signal holds after it was sent, unless
// sent again: what the client applies.
const SignalExpiresMS = 3000

// RoomSignalEntry is one signal of a room_signal frame.
type RoomSignalEntry struct {
	UserID    string          `json:"user_id"`
	ConnID    string          `json:"conn_id"`
	Signal    string          `json:"signal"`
	Data      json.RawMessage `json:"data,omitempty"`
	ExpiresMS int             `json:"expires_ms"`
}

// RoomSignal carries the signals of a room since the socket's last frame
// of them.
type RoomSignal struct {
	Type    string            `json:"type"`
	Room    string            `json:"room"`
	Signals []RoomSignalEntry `json:"signals"`
}

// RoomDenied refuses a join, or ends a membership.
type RoomDenied struct {
	Type   string `json:"type"`
	ID     string `json:"id,omitempty"`
	Room   string `json:"room"`
	Reason string `json:"reason"`
}

// ServerMessage is any message the gateway sends, as a client decodes it.
type ServerMessage struct {
	Type                string              `json:"type"`
	ID                  string              `json:"id,omitempty"`
	UserID              string              `json:"user_id,omitempty"`
	ConnID              string              `json:"conn_id,omitempty"`
	HeartbeatIntervalMS int64               `json:"heartbeat_interval_ms,omitempty"`
	TTLMS               int64               `json:"ttl_ms,omitempty"`
	Status              presence.Status     `json:"status,omitempty"`
	Devices             int                 `json:"devices,omitempty"`
	Custom              *presence.Custom    `json:"custom_status,omitempty"`
	Users               []presence.Presence `json:"users,omitempty"`
	OnlineCount         *int                `json:"online_count,omitempty"`
	Updates             []presence.Presence `json:"updates,omitempty"`
	Reason              string              `json:"reason,omitempty"`
	Code                string              `json:"code,omitempty"`
	Message             string              `json:"message,omitempty"`
	Room                string              `json:"room,omitempty"`
	Members             []RoomMember        `json:"members,omitempty"`
	Count               int                 `json:"count,omitempty"`
	Truncated           bool                `json:"truncated,omitempty"`
	Joins               []RoomMember        `json:"joins,omitempty"`
	Leaves              []RoomMember        `json:"leaves,omitempty"`
	Signals             []RoomSignalEntry   `json:"signals,omitempty"`
}

// AppendBatch appends the JSON of a presence_batch frame to dst. It writes
// the same bytes as encoding/json would for PresenceBatch, without
// reflection or allocation; user ids and statuses never need escaping (they
// are validated), which is what makes this safe.
func AppendBatch(dst []byte, updates []presence.Presence) []byte {
	dst = append(dst, `{"type":"presence_batch","updates":[`...)
	for i := range updates {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendPresence(dst, &updates[i])
	}
	return append(dst, "]}"...)
}

// AppendPresence appends the JSON of one presence object to dst, as
// encoding/json would write it.
func AppendPresence(dst []byte, p *presence.Presence) []byte {
	dst = append(dst, `{"user_id":"`...)
	dst = append(dst, p.UserID...)
	dst = append(dst, `","status":"`...)
	dst = append(dst, p.Status...)
	dst = append(dst, '"')
	if p.LastSeen != 0 {
		dst = append(dst, `,"last_seen":`...)
		dst = strconv.AppendInt(dst, p.LastSeen, 10)
	}
	if p.Platforms != 0 {
		dst = append(dst, `,"platforms":`...)
		dst = p.Platforms.AppendJSON(dst)
	}
	if p.Custom != nil {
		dst = appendCustom(dst, p.Custom)
	}
	return append(dst, '}')
}

// appendCustom appends `,"custom_status":` and c's JSON, which needs
// escaping: encoding/json writes it.
func appendCustom(dst []byte, c *presence.Custom) []byte {
	b, err := json.Marshal(c)
	if err != nil {
		return dst // a struct of strings and a number always encodes
	}
	dst = append(dst, `,"custom_status":`...)
	return append(dst, b...)
}

// AppendSelf appends the JSON of a self frame to dst, as encoding/json
// would write it.
func AppendSelf(dst []byte, status presence.Status, devices int, custom *presence.Custom) []byte {
	dst = append(dst, `{"type":"self","status":"`...)
	dst = append(dst, status...)
	dst = append(dst, `","devices":`...)
	dst = strconv.AppendInt(dst, int64(devices), 10)
	if custom != nil {
		dst = appendCustom(dst, custom)
	}
	return append(dst, '}')
}
