package presence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

func TestParseCustom(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name        string
		text, emoji string
		expires     int64
		want        *presence.Custom
		says        string // in the error; empty for none
	}{
		{name: "text and emoji", text: "In a meeting", emoji: "📅", want: &presence.Custom{Text: "In a meeting", Emoji: "📅"}},
		{name: "shortcode, an hour", emoji: ":calendar:", expires: now.Unix() + 3600, want: &presence.Custom{Emoji: ":calendar:", ExpiresAt: now.Unix() + 3600}},
		{name: "a family emoji", emoji: "👨‍👩‍👧‍👦", want: &presence.Custom{Emoji: "👨‍👩‍👧‍👦"}},
		{name: "100 characters", text: strings.Repeat("ü", 100), want: &presence.Custom{Text: strings.Repeat("ü", 100)}},
		{name: "a year ahead", text: "x", expires: now.Add(presence.MaxCustomTTL).Unix(), want: &presence.Custom{Text: "x", ExpiresAt: now.Add(presence.MaxCustomTTL).Unix()}},
		{name: "empty clears", want: nil},
		{name: "101 characters", text: strings.Repeat("ü", 101), says: "text has 101 characters, at most 100"},
		{name: "a tab", text: "a\tb", says: "text has a control character (U+0009)"},
		{name: "a line separator", text: "a\u2028b", says: "text has a control character (U+2028)"},
		{name: "not UTF-8", text: "a\xffb", says: "text is not valid UTF-8"},
		{name: "emoji too long", emoji: strings.Repeat("🙂", 17), says: "emoji has 17 characters, at most 16"},
		{name: "emoji with a space", emoji: "🙂 🙂", says: "emoji has a space"},
		{name: "expired", text: "x", expires: now.Unix(), says: "is not in the future"},
		{name: "too far", text: "x", expires: now.Add(presence.MaxCustomTTL).Unix() + 1, says: "more than 366 days ahead"},
		{name: "negative", text: "x", expires: -5, says: "want unix seconds"},
		{name: "expiry alone", expires: now.Unix() + 60, says: "expires_at without text or emoji"},
	} {
		got, err := presence.ParseCustom(tc.text, tc.emoji, tc.expires, now)
		switch {
		case tc.says != "" && (err == nil || !errors.Is(err, presence.ErrInvalidCustom) || !strings.Contains(err.Error(), tc.says)):
			t.Errorf("%s: %+v, %v; want an invalid custom status saying %q", tc.name, got, err, tc.says)
		case tc.says == "" && (err != nil || !got.Equal(tc.want)):
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

// TestRecordCustom: a custom status moves the user's own view (SelfVer)
// whenever it changes, and the public one (PubVer) only where others see
// it: not while the user is invisible. It stays while they are offline;
// Presence leaves out one that expired.
func TestRecordCustom(t *testing.T) {
	t.Parallel()
	var r presence.Record
	at := time.Unix(1_800_000_000, 0)
	step := func(chosen presence.Status, custom *presence.Custom, cs map[string]presence.ConnInfo) (pub, self bool) {
		prev := r.Clone()
		r.Chosen, r.Custom, r.Conns = chosen, custom, cs
		at = at.Add(time.Second)
		r.Finish(&prev, at)
		return r.PubVer != prev.PubVer, r.SelfVer != prev.SelfVer
	}
	lunch := &presence.Custom{Text: "Lunch", Emoji: "🥪", ExpiresAt: at.Unix() + 3600}
	step("", nil, conns(active))
	for _, tc := range []struct {
		name       string
		chosen     presence.Status
		custom     *presence.Custom
		conns      map[string]presence.ConnInfo
		pub, self  bool
		publicSees *presence.Custom
	}{
		{"set", "", lunch, conns(active), true, true, lunch},
		{"the same again", "", &presence.Custom{Text: "Lunch", Emoji: "🥪", ExpiresAt: lunch.ExpiresAt}, conns(active), false, false, lunch},
		{"invisible", presence.Invisible, lunch, conns(active), true, true, nil},
		{"changed while invisible", presence.Invisible, &presence.Custom{Text: "Gym"}, conns(active), false, true, nil},
		{"visible again", "", &presence.Custom{Text: "Gym"}, conns(active), true, true, &presence.Custom{Text: "Gym"}},
		{"offline", "", &presence.Custom{Text: "Gym"}, nil, true, true, &presence.Custom{Text: "Gym"}},
		{"cleared while offline", "", nil, nil, true, true, nil},
	} {
		pub, self := step(tc.chosen, tc.custom, tc.conns)
		if pub != tc.pub || self != tc.self {
			t.Errorf("%s: public moved %v, own moved %v; want %v, %v", tc.name, pub, self, tc.pub, tc.self)
		}
		if got := r.PublicCustom(); !got.Equal(tc.publicSees) {
			t.Errorf("%s: others see %+v, want %+v", tc.name, got, tc.publicSees)
		}
		if got := r.Presence("bob").Custom; !got.Equal(tc.publicSees) {
			t.Errorf("%s: Presence has %+v, want %+v", tc.name, got, tc.publicSees)
		}
	}
	r.Custom = &presence.Custom{Text: "Old", ExpiresAt: time.Now().Unix() - 1}
	if p := r.Presence("bob"); p.Custom != nil {
		t.Errorf("Presence of an expired custom status: %+v, want none", p.Custom)
	}
}
