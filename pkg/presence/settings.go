package presence

import "fmt"

// Visibility says who may see a user's last_seen.
type Visibility string

// The last_seen visibilities.
const (
	// Everyone lets every allowed watcher see last_seen.
	Everyone Visibility = "everyone"
	// Contacts lets watchers the user follows see last_seen. It is the
	// default.
	Contacts Visibility = "contacts"
	// Nobody hides last_seen from everyone but the user.
	Nobody Visibility = "nobody"
)

// ParseVisibility parses a last_seen visibility. It wraps
// ErrInvalidVisibility for anything else.
func ParseVisibility(s string) (Visibility, error) {
	switch v := Visibility(s); v {
	case Everyone, Contacts, Nobody:
		return v, nil
	}
	return "", fmt.Errorf("%w: %q (want everyone, contacts or nobody)", ErrInvalidVisibility, s)
}

// Settings is the value of a user's "settings.<user>" key in GraphBucket.
type Settings struct {
	// LastSeen is who may see the user's last_seen; empty means Contacts.
	LastSeen Visibility `json:"last_seen,omitempty"`
}

// LastSeenVisibility returns the effective last_seen visibility.
func (s Settings) LastSeenVisibility() Visibility {
	if s.LastSeen == "" {
		return Contacts
	}
	return s.LastSeen
}

// ShowLastSeen reports whether a watcher may see the last_seen of a user
// with these settings. self is true when the watcher is the user; contact is
// true when the user follows the watcher.
func (s Settings) ShowLastSeen(self, contact bool) bool {
	if self {
		return true
	}
	switch s.LastSeenVisibility() {
	case Everyone:
		return true
	case Contacts:
		return contact
	default:
		return false
	}
}
