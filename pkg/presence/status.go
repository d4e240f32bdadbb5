package presence

import "fmt"

// Status is a presence status.
type Status string

// The statuses. A user chooses Online, Away, Busy or Invisible; Offline is
// what a user with no live connection is, and what others see of an
// invisible user.
const (
	Online    Status = "online"
	Away      Status = "away"
	Busy      Status = "busy"
	Invisible Status = "invisible"
	Offline   Status = "offline"
)

// ParseChosen parses a status a user may choose. It wraps ErrInvalidStatus
// for anything else, including "offline".
func ParseChosen(s string) (Status, error) {
	switch st := Status(s); st {
	case Online, Away, Busy, Invisible:
		return st, nil
	}
	return "", fmt.Errorf("%w: %q (want online, away, busy or invisible)", ErrInvalidStatus, s)
}

// Public returns the status others see for a user whose true status is s:
// invisible looks offline.
func (s Status) Public() Status {
	if s == Invisible {
		return Offline
	}
	return s
}

// Visible reports whether others see the user as connected (online, away or
// busy).
func (s Status) Visible() bool { return s == Online || s == Away || s == Busy }
