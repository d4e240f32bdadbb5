package webhook

import (
	"fmt"

	"github.com/greendot/greendot/pkg/presence"
)

// Event is one transition of a user, as a delivery carries it.
type Event struct {
	// UserID is the user whose presence changed.
	UserID string `json:"user_id"`
	// Status is online, away, busy or offline; invisible too when the
	// process sends invisible users' true status (InvisibleTrue).
	Status presence.Status `json:"status"`
	// LastSeen is when the user was last seen by others, in unix seconds;
	// zero (left out) when never. It does not move while the user is
	// invisible.
	LastSeen int64 `json:"last_seen,omitempty"`
	// Devices counts the user's live connections; zero while offline (and
	// while invisible, when invisible users are sent as others see them).
	Devices int `json:"devices"`
	// CustomStatus is the user's custom status, if any (none for an
	// invisible user sent as others see them).
	CustomStatus *presence.Custom `json:"custom_status,omitempty"`
	// Rev is the presence_status revision the event was made from. A
	// user's revisions only grow: a receiver keeps the highest it applied
	// per user and drops an event whose Rev is not above it.
	Rev uint64 `json:"rev"`
	// At is when the revision was written, in unix milliseconds.
	At int64 `json:"at"`
}

// Batch is the JSON body of a delivery: events in the order of their
// revisions.
type Batch struct {
	Events []Event `json:"events"`
}

// Invisible says what a process sends of a user who chose invisible.
type Invisible string

const (
	// InvisibleTrue sends invisible users' true status, invisible, and
	// their devices: the app's backend knows. Watchers never see it.
	InvisibleTrue Invisible = "true"
	// InvisiblePublic sends what watchers see: offline, with no devices.
	InvisiblePublic Invisible = "public"
)

// ParseInvisible parses "true" or "public".
func ParseInvisible(s string) (Invisible, error) {
	switch v := Invisible(s); v {
	case InvisibleTrue, InvisiblePublic:
		return v, nil
	}
	return "", fmt.Errorf("invisible %q: want true or public", s)
}

// EventOf returns the event of a user's record written at revision rev;
// a nil rec means the record was deleted (offline). at is when the
// revision was stored, for a deleted record, in unix milliseconds.
func EventOf(userID string, rec *presence.Record, rev uint64, at int64, invisible Invisible) Event {
	if rec == nil {
		return Event{UserID: userID, Status: presence.Offline, Rev: rev, At: at}
	}
	ev := Event{UserID: userID, Status: rec.Status, LastSeen: rec.LastSeen, Devices: rec.Devices, CustomStatus: rec.Custom, Rev: rev, At: rec.Updated}
	if invisible == InvisiblePublic {
		ev.Status, ev.CustomStatus = rec.Public, rec.PublicCustom()
	}
	if ev.Status == "" || ev.Status == presence.Offline {
		ev.Status, ev.Devices = presence.Offline, 0
	}
	if ev.At == 0 {
		ev.At = at
	}
	return ev
}

// state is what a receiver keeps of an event: a record written again
// with the same state is no transition.
type state struct {
	status   presence.Status
	lastSeen int64
	devices  int
	custom   presence.Custom // the zero value for none
}

func (e *Event) state() state {
	st := state{status: e.Status, lastSeen: e.LastSeen, devices: e.Devices}
	if e.CustomStatus != nil {
		st.custom = *e.CustomStatus
	}
	return st
}
