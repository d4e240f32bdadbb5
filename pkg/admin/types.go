package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// UserRequest names the user a request is about. On the wire it is
// {"user_id": "alice"}, or simply the bare user id (alice), which is what
// an operator typing `nats req greendot.gateway.conns alice` sends.
type UserRequest struct {
	UserID string `json:"user_id"`
}

// KickRequest asks every gateway to close a user's sockets. On the wire it
// is a JSON object, or a bare user id (all of the user's sockets, code
// 1008).
type KickRequest struct {
	UserID string `json:"user_id"`
	// ConnID, when set, closes only that connection.
	ConnID string `json:"conn_id,omitempty"`
	// Code is the WebSocket close code: 1008 (policy violation, the
	// default) or 1000 (normal close).
	Code int `json:"code,omitempty"`
	// Reason is the close frame's reason; empty means "kicked by an
	// operator". At most MaxReasonLen bytes.
	Reason string `json:"reason,omitempty"`
}

// The close codes a kick may use.
const (
	CloseNormal = 1000
	ClosePolicy = 1008
)

// MaxReasonLen bounds a kick's reason: a close frame's payload is at most
// 125 bytes, two of them the code.
const MaxReasonLen = 123

// DefaultKickReason is the close reason of a kick that names none.
const DefaultKickReason = "kicked by an operator"

// KickReply is one gateway's answer to a kick.
type KickReply struct {
	// Gateway is the id of the gateway answering.
	Gateway string `json:"gateway"`
	UserID  string `json:"user_id"`
	// Closed lists the connection ids this gateway closed; empty when it
	// held none of the user's sockets.
	Closed []string `json:"closed"`
	Code   int      `json:"code"`
}

// ConnsReply is what presence_status and presence_conns say about a user:
// the status record, and every connection either of them knows.
type ConnsReply struct {
	UserID string `json:"user_id"`
	// Status is the user's true status (what their own devices see);
	// Public is what everybody else sees (invisible looks offline).
	Status presence.Status `json:"status"`
	Public presence.Status `json:"public"`
	// Chosen is the status the user chose; empty means online.
	Chosen presence.Status `json:"chosen,omitempty"`
	// Devices counts the live connections that are not closing.
	Devices int `json:"devices"`
	// Since is when Status last changed; LastSeen is when Public last
	// changed to or from a visible status. Both are absent when unknown.
	Since    *time.Time `json:"since,omitempty"`
	LastSeen *time.Time `json:"last_seen,omitempty"`
	// Revision is the status record's revision in presence_status (zero
	// when the user has no record).
	Revision uint64 `json:"revision"`
	// Conns are the user's connections, by connection id order.
	Conns []ConnInfo `json:"conns"`
}

// ConnInfo is one connection of a user, as the buckets know it.
type ConnInfo struct {
	ConnID string `json:"conn_id"`
	// Gateway is the id of the gateway holding the socket.
	Gateway string `json:"gateway"`
	// Lease is the epoch of the gateway's lease the connection is held
	// under; absent for a key of the earlier shape.
	Lease  string `json:"lease,omitempty"`
	Device string `json:"device,omitempty"`
	// Platform is the platform its client named (web, desktop, mobile).
	Platform string `json:"platform,omitempty"`
	// Since is when the connection was established.
	Since time.Time `json:"since"`
	// ActiveAt is, for a key of the earlier shape, the last activity its
	// gateway wrote to it; absent otherwise.
	ActiveAt *time.Time `json:"active_at,omitempty"`
	// Idle reports that the connection is not in use (the client said
	// idle, or it had no activity for the away-after period).
	Idle bool `json:"idle"`
	// Closing reports that the socket closed cleanly and the connection
	// only lives out the offline grace.
	Closing bool `json:"closing"`
	// InRecord reports that the status record counts the connection;
	// KeyLive that its key in presence_conns exists. Both are true for a
	// healthy connection; a key that is gone while the record still counts
	// it is a removal the reaper has not applied yet.
	InRecord bool `json:"in_record"`
	KeyLive  bool `json:"key_live"`
}

// WatchersReply is one gateway's answer to a watchers request: its
// sockets that receive the user's presence changes.
type WatchersReply struct {
	Gateway string `json:"gateway"`
	UserID  string `json:"user_id"`
	// Subscribed reports that the gateway holds a NATS subscription on the
	// user's event subject (presence.event.<user>), or, under the everyone
	// policy, on every user's.
	Subscribed bool `json:"subscribed"`
	// Watchers are the sockets subscribed to the user, and, under the
	// everyone policy, the sockets watching every user.
	Watchers []Watcher `json:"watchers"`
}

// Watcher is one socket watching a user.
type Watcher struct {
	UserID string    `json:"user_id"`
	ConnID string    `json:"conn_id"`
	Device string    `json:"device,omitempty"`
	Since  time.Time `json:"since"`
	// All reports that the socket watches every user (global presence).
	All bool `json:"all,omitempty"`
}

// SweepReply is a reaper's answer to a sweep request.
type SweepReply struct {
	// Instance is the micro instance id of the reaper that swept.
	Instance string `json:"instance"`
	// Removed counts the connections the sweep took out of status records.
	Removed  int           `json:"removed"`
	Duration time.Duration `json:"duration_ns"`
}

// Info is a process's answer on its info subject: who it is, its
// configuration, and its load now.
type Info struct {
	// Service is the micro service name; Instance the micro instance id
	// (as `nats micro ls` shows it); ID the process's own id where it has
	// one (a gateway's id).
	Service  string `json:"service"`
	Instance string `json:"instance"`
	ID       string `json:"id,omitempty"`
	// Version is the version of greendot the process runs, the one
	// greendot --version prints; Started is when its service started.
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	// Ready reports that the process is connected to NATS and its buckets
	// are present; NotReady says why not.
	Ready    bool   `json:"ready"`
	NotReady string `json:"not_ready,omitempty"`
	// Config is the process's configuration, with defaults filled in.
	Config map[string]any `json:"config"`
	// Load is what the process holds now (connections, watched users,
	// pending work ...).
	Load map[string]any `json:"load"`
}

// ErrorBody is the JSON body of an error reply.
type ErrorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// ParseUserRequest decodes a UserRequest: a JSON object, or a bare user
// id. The user id must be valid.
func ParseUserRequest(data []byte) (UserRequest, error) {
	var r UserRequest
	if err := decode(data, &r, func(s string) { r.UserID = s }); err != nil {
		return r, err
	}
	if !presence.ValidUserID(r.UserID) {
		return r, fmt.Errorf("%w: user_id %q: want 1 to 64 characters of A-Z a-z 0-9 _ -", ErrBadRequest, r.UserID)
	}
	return r, nil
}

// ParseKickRequest decodes a KickRequest: a JSON object, or a bare user
// id. It checks every field and fills in the default code and reason.
func ParseKickRequest(data []byte) (KickRequest, error) {
	var r KickRequest
	if err := decode(data, &r, func(s string) { r.UserID = s }); err != nil {
		return r, err
	}
	switch {
	case !presence.ValidUserID(r.UserID):
		return r, fmt.Errorf("%w: user_id %q: want 1 to 64 characters of A-Z a-z 0-9 _ -", ErrBadRequest, r.UserID)
	case r.ConnID != "" && (strings.ContainsAny(r.ConnID, ". *>") || len(r.ConnID) > 64):
		return r, fmt.Errorf("%w: conn_id %q is not a connection id", ErrBadRequest, r.ConnID)
	case r.Code != 0 && r.Code != CloseNormal && r.Code != ClosePolicy:
		return r, fmt.Errorf("%w: code %d: want %d or %d", ErrBadRequest, r.Code, CloseNormal, ClosePolicy)
	case len(r.Reason) > MaxReasonLen:
		return r, fmt.Errorf("%w: reason is %d bytes: at most %d fit in a close frame", ErrBadRequest, len(r.Reason), MaxReasonLen)
	}
	if r.Code == 0 {
		r.Code = ClosePolicy
	}
	if r.Reason == "" {
		r.Reason = DefaultKickReason
	}
	return r, nil
}

// decode reads a JSON object into v, or hands a bare word to bare.
func decode(data []byte, v any, bare func(string)) error {
	trimmed := bytes.TrimSpace(data)
	switch {
	case len(trimmed) == 0:
		return fmt.Errorf("%w: empty request: send a user id or a JSON object", ErrBadRequest)
	case trimmed[0] == '{':
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
		if dec.More() {
			return fmt.Errorf("%w: trailing data after the JSON object", ErrBadRequest)
		}
		return nil
	case trimmed[0] == '"':
		var s string
		if err := json.Unmarshal(trimmed, &s); err != nil {
			return fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
		bare(s)
		return nil
	default:
		bare(string(trimmed))
		return nil
	}
}
