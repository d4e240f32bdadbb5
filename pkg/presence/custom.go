package presence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
)

// Custom is a user's custom status: a short text and an emoji, with an
// optional time the server clears it at, shared by all of the user's
// devices (Slack's status_text, status_emoji and status_expiration).
type Custom struct {
	Text  string `json:"text,omitempty"`
	Emoji string `json:"emoji,omitempty"`
	// ExpiresAt is when it is cleared, in unix seconds; zero: never.
	ExpiresAt int64 `json:"expires_at,omitempty"`
}

// Limits of a custom status, in Unicode code points, and of its expiry.
const (
	MaxCustomText  = 100
	MaxCustomEmoji = 16
	MaxCustomTTL   = 366 * 24 * time.Hour
)

// ErrInvalidCustom means a custom status is not one a user may set.
var ErrInvalidCustom = errors.New("invalid custom status")

// ParseCustom checks a custom status a user sets at now: text of at most
// MaxCustomText code points, an emoji (a character, a sequence of them, or
// a shortcode such as ":calendar:") of at most MaxCustomEmoji with no
// space, neither with control characters, and an expiry (unix seconds;
// zero for none) after now and at most MaxCustomTTL ahead. Empty text and
// emoji, with no expiry, clear it: it returns nil then. Errors wrap
// ErrInvalidCustom and name the field.
func ParseCustom(text, emoji string, expiresAt int64, now time.Time) (*Custom, error) {
	if err := checkCustomText("text", text, MaxCustomText, false); err != nil {
		return nil, err
	}
	if err := checkCustomText("emoji", emoji, MaxCustomEmoji, true); err != nil {
		return nil, err
	}
	switch {
	case expiresAt < 0:
		return nil, fmt.Errorf("%w: expires_at %d: want unix seconds, or 0 for never", ErrInvalidCustom, expiresAt)
	case expiresAt == 0:
	case text == "" && emoji == "":
		return nil, fmt.Errorf("%w: expires_at without text or emoji (an empty custom status clears it)", ErrInvalidCustom)
	case expiresAt <= now.Unix():
		return nil, fmt.Errorf("%w: expires_at %d is not in the future", ErrInvalidCustom, expiresAt)
	case time.Unix(expiresAt, 0).Sub(now) > MaxCustomTTL:
		return nil, fmt.Errorf("%w: expires_at %d is more than %d days ahead", ErrInvalidCustom, expiresAt, MaxCustomTTL/(24*time.Hour))
	}
	if text == "" && emoji == "" {
		return nil, nil
	}
	return &Custom{Text: text, Emoji: emoji, ExpiresAt: expiresAt}, nil
}

func checkCustomText(field, s string, max int, noSpace bool) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidCustom, field)
	}
	if n := utf8.RuneCountInString(s); n > max {
		return fmt.Errorf("%w: %s has %d characters, at most %d", ErrInvalidCustom, field, n, max)
	}
	for _, r := range s {
		switch {
		case unicode.IsControl(r) || r == utf8.RuneError || r == '\u2028' || r == '\u2029':
			return fmt.Errorf("%w: %s has a control character (%U)", ErrInvalidCustom, field, r)
		case noSpace && unicode.IsSpace(r):
			return fmt.Errorf("%w: %s has a space", ErrInvalidCustom, field)
		}
	}
	return nil
}

// Expired reports whether c is one whose expiry has come at now.
func (c *Custom) Expired(now time.Time) bool {
	return c != nil && c.ExpiresAt != 0 && c.ExpiresAt <= now.Unix()
}

// Equal reports whether c and d say the same (both nil included).
func (c *Custom) Equal(d *Custom) bool {
	if c == nil || d == nil {
		return c == d
	}
	return *c == *d
}

// PublicCustom returns the custom status others see: none while the user
// chose to be invisible. One that expired is still here until a reaper
// clears it (about a second after): Presence, which answers readers, leaves
// it out meanwhile; the events of revisions carry what the revision says,
// so that its clearing is one.
func (r *Record) PublicCustom() *Custom {
	if r.Custom == nil || r.ChosenStatus() == Invisible {
		return nil
	}
	return r.Custom
}

// TimersBucket holds one key per deadline the server keeps for users,
// with a per-key TTL that ends at the deadline: "custom.<user>"
// (CustomTimerKey), value a CustomTimer, ends when the user's custom
// status expires; a reaper then clears it. A key is rewritten with each
// new expiry; one whose custom status changed since expires to no effect.
const TimersBucket = "presence_timers"

// TimersMarkerTTL is how long TimersBucket keeps the marker of a timer
// that ended, so that a reaper that was down for less still clears every
// custom status that expired meanwhile; after longer, its start-up sweep
// does.
const TimersMarkerTTL = 24 * time.Hour

// CustomTimerKey returns the TimersBucket key of a user's custom status
// expiry; CustomTimerKey(">") is the filter of all of them.
func CustomTimerKey(userID string) string { return "custom." + userID }

// CustomTimer is the value of a key in TimersBucket.
type CustomTimer struct {
	// ExpiresAt is the expiry the key was written for, in unix seconds.
	ExpiresAt int64 `json:"expires_at"`
}

// SetCustomTimer writes the timer of a custom status of userID's that
// expires at expiresAt (unix seconds): its key in TimersBucket, with a TTL
// that ends then (rounded up to a whole second), replacing the timer
// before.
func (s *Store) SetCustomTimer(ctx context.Context, userID string, expiresAt int64) error {
	data, err := json.Marshal(CustomTimer{ExpiresAt: expiresAt})
	if err != nil {
		return err
	}
	ttl := TTLSeconds(time.Unix(expiresAt, 0).Sub(s.now()))
	if _, err := s.js.Publish(ctx, KeySubject(TimersBucket, CustomTimerKey(userID)), data, jetstream.WithMsgTTL(ttl)); err != nil {
		return fmt.Errorf("write the timer of %s's custom status: %w", userID, err)
	}
	return nil
}

// ClearExpiredCustom clears userID's custom status if it expired by now,
// by compare-and-set, and returns the write; written false when there was
// nothing to clear (none, none that expires, or a later one set since).
func (s *Store) ClearExpiredCustom(ctx context.Context, userID string, now time.Time) (Write, error) {
	var cache Cached
	w, err := s.WriteStatus(ctx, userID, &cache, func(r *Record) error {
		if !r.Custom.Expired(now) {
			return ErrNoChange
		}
		r.Custom = nil
		return nil
	})
	if errors.Is(err, ErrNotFound) {
		return Write{}, nil
	}
	return w, err
}
