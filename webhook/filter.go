package webhook

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// EventType names a kind of change an event may carry, for Config.Events.
type EventType string

// The kinds of change of a user's presence.
const (
	// EventStatus: the user's status changed (online, away, busy,
	// offline; invisible too when sent true).
	EventStatus EventType = "status"
	// EventDevices: the number of the user's live connections changed.
	EventDevices EventType = "devices"
	// EventLastSeen: the user's last_seen moved.
	EventLastSeen EventType = "last_seen"
	// EventCustomStatus: the user's custom status was set, changed or
	// cleared.
	EventCustomStatus EventType = "custom_status"
)

// EventTypes are every EventType, in the order they are documented.
var EventTypes = []EventType{EventStatus, EventDevices, EventLastSeen, EventCustomStatus}

// ParseEventType parses the name of an EventType.
func ParseEventType(s string) (EventType, error) {
	if t := EventType(s); slices.Contains(EventTypes, t) {
		return t, nil
	}
	names := make([]string, len(EventTypes))
	for i, t := range EventTypes {
		names[i] = string(t)
	}
	return "", fmt.Errorf("event type %q: want one of %s", s, strings.Join(names, ", "))
}

// CheckUserPattern reports whether p is a pattern of user ids that
// Config.Users takes: a user id, or one with * (any run of characters),
// ? (one character) or a class such as [a-f], as path.Match reads them.
func CheckUserPattern(p string) error {
	if p == "" {
		return fmt.Errorf("user pattern %q: empty", p)
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("user pattern %q: %v", p, err)
	}
	return nil
}

// filter is what Config.Users and Config.Events let through.
type filter struct {
	users  []string
	events []EventType
}

// user reports whether userID's events are sent.
func (f *filter) user(userID string) bool {
	if len(f.users) == 0 {
		return true
	}
	for _, p := range f.users {
		if ok, _ := path.Match(p, userID); ok {
			return true
		}
	}
	return false
}

// change reports whether a revision of state next over prev carries a
// change f sends.
func (f *filter) change(prev, next state) bool {
	if len(f.events) == 0 {
		return true
	}
	for _, t := range f.events {
		switch t {
		case EventStatus:
			if prev.status != next.status {
				return true
			}
		case EventDevices:
			if prev.devices != next.devices {
				return true
			}
		case EventLastSeen:
			if prev.lastSeen != next.lastSeen {
				return true
			}
		case EventCustomStatus:
			if prev.custom != next.custom {
				return true
			}
		}
	}
	return false
}
