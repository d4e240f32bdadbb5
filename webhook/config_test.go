package webhook_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/webhook"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := func() webhook.Config {
		return webhook.Config{URL: "https://user:pw@app.example/hooks", Secret: []byte("0123456789abcdef")}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("a URL and a secret: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*webhook.Config)
		want string
	}{
		{"no URL", func(c *webhook.Config) { c.URL = "" }, "no URL"},
		{"not http", func(c *webhook.Config) { c.URL = "ftp://app.example/x" }, `want http:// or https://`},
		{"not a URL", func(c *webhook.Config) { c.URL = "https://user:pw@app.example/%zz" }, "invalid URL escape"},
		{"no host", func(c *webhook.Config) { c.URL = "https:///hooks" }, "and a host"},
		{"short secret", func(c *webhook.Config) { c.Secret = []byte("short") }, "secret of 5 bytes: want at least 16"},
		{"short previous secret", func(c *webhook.Config) { c.PreviousSecret = []byte("short") }, "previous secret of 5 bytes: want at least 16"},
		{"previous secret is the secret", func(c *webhook.Config) { c.PreviousSecret = c.Secret }, "the previous secret is the secret"},
		{"bad consumer", func(c *webhook.Config) { c.Consumer = "a.b" }, `consumer "a.b"`},
		{"the fanout's consumer", func(c *webhook.Config) { c.Consumer = presence.FanoutConsumer }, "a name of their own"},
		{"the reaper's consumer", func(c *webhook.Config) { c.Consumer = presence.ReaperConsumer }, "a name of their own"},
		{"bad invisible", func(c *webhook.Config) { c.Invisible = "hidden" }, `invisible "hidden"`},
		{"bad user pattern", func(c *webhook.Config) { c.Users = []string{"team_*", "[a-"} }, `user pattern "[a-": syntax error in pattern`},
		{"empty user pattern", func(c *webhook.Config) { c.Users = []string{""} }, `user pattern "": empty`},
		{"unknown event type", func(c *webhook.Config) { c.Events = []webhook.EventType{"status", "typing"} }, `event type "typing": want one of status, devices, last_seen, custom_status`},
		{"huge batch", func(c *webhook.Config) { c.BatchSize = 20_000 }, "batch size 20000"},
		{"long batch wait", func(c *webhook.Config) { c.BatchWait = 2 * time.Minute }, "batch wait 2m0s"},
		{"negative timeout", func(c *webhook.Config) { c.Timeout = -time.Second }, "negative duration"},
		{"negative rate", func(c *webhook.Config) { c.RateLimit = -1 }, "rate limit -1"},
		{"rate not a number", func(c *webhook.Config) { c.RateLimit = math.NaN() }, "rate limit NaN"},
		{"backoffs crossed", func(c *webhook.Config) { c.MinBackoff = 2 * time.Minute }, "max backoff 1m0s: want at least the min backoff 2m0s"},
		{"short ack wait", func(c *webhook.Config) { c.AckWait = time.Second }, "ack wait 1s: want at least 3s"},
		{"short pinned TTL", func(c *webhook.Config) { c.PinnedTTL = time.Second }, "pinned TTL 1s: want at least 3s"},
		{"bad replicas", func(c *webhook.Config) { c.Buckets.Replicas = 9 }, "replicas 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.edit(&c)
			err := c.Validate()
			if !errors.Is(err, webhook.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an invalid config error containing %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "pw@") {
				t.Errorf("the error shows the URL's password: %v", err)
			}
		})
	}
}

func TestParseInvisible(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"true", "public"} {
		if v, err := webhook.ParseInvisible(s); err != nil || string(v) != s {
			t.Errorf("ParseInvisible(%q) = %q, %v", s, v, err)
		}
	}
	if _, err := webhook.ParseInvisible("offline"); err == nil {
		t.Error("ParseInvisible(offline) accepted")
	}
}

// TestEventOf: what an event says of a record, in both invisible modes.
func TestEventOf(t *testing.T) {
	t.Parallel()
	rec := &presence.Record{Status: presence.Invisible, Public: presence.Offline, Devices: 2, LastSeen: 50, Updated: 1234}
	if ev := webhook.EventOf("bob", rec, 7, 999, webhook.InvisibleTrue); ev != (webhook.Event{UserID: "bob", Status: presence.Invisible, Devices: 2, LastSeen: 50, Rev: 7, At: 1234}) {
		t.Errorf("true: %+v", ev)
	}
	if ev := webhook.EventOf("bob", rec, 7, 999, webhook.InvisiblePublic); ev != (webhook.Event{UserID: "bob", Status: presence.Offline, LastSeen: 50, Rev: 7, At: 1234}) {
		t.Errorf("public: %+v", ev)
	}
	if ev := webhook.EventOf("carol", nil, 8, 999, webhook.InvisibleTrue); ev != (webhook.Event{UserID: "carol", Status: presence.Offline, Rev: 8, At: 999}) {
		t.Errorf("deleted: %+v", ev)
	}
	if ev := webhook.EventOf("dan", &presence.Record{}, 9, 999, webhook.InvisibleTrue); ev.Status != presence.Offline || ev.At != 999 {
		t.Errorf("empty record: %+v", ev)
	}
	// A custom status: the backend is sent it, unless the user chose
	// invisible and the process sends what watchers see.
	meeting := &presence.Custom{Text: "In a meeting", Emoji: "📅", ExpiresAt: 1800000000}
	busy := &presence.Record{Chosen: presence.Busy, Custom: meeting, Status: presence.Busy, Public: presence.Busy, Devices: 1, Updated: 1234}
	for _, inv := range []webhook.Invisible{webhook.InvisibleTrue, webhook.InvisiblePublic} {
		if ev := webhook.EventOf("erin", busy, 10, 999, inv); !ev.CustomStatus.Equal(meeting) {
			t.Errorf("busy with a custom status, invisible %s: %+v", inv, ev)
		}
	}
	hidden := &presence.Record{Chosen: presence.Invisible, Custom: meeting, Status: presence.Invisible, Public: presence.Offline, Devices: 1, Updated: 1234}
	if ev := webhook.EventOf("erin", hidden, 11, 999, webhook.InvisibleTrue); !ev.CustomStatus.Equal(meeting) {
		t.Errorf("invisible with a custom status, true: %+v", ev)
	}
	if ev := webhook.EventOf("erin", hidden, 11, 999, webhook.InvisiblePublic); ev.CustomStatus != nil {
		t.Errorf("invisible with a custom status, public: %+v", ev)
	}
}

// TestRetryWait: the wait before a retry is the backoff with up to a fifth
// more at random, or the endpoint's Retry-After, and never longer than
// the max backoff, so that --webhook-max-backoff is the longest wait
// between two attempts.
func TestRetryWait(t *testing.T) {
	t.Parallel()
	const maxBackoff = 2 * time.Second
	for _, tt := range []struct {
		name                string
		backoff, retryAfter time.Duration
		least, most         time.Duration
		varies              bool
	}{
		{"first", 500 * time.Millisecond, 0, 500 * time.Millisecond, 600 * time.Millisecond, true},
		{"below the max", 1500 * time.Millisecond, 0, 1500 * time.Millisecond, 1800 * time.Millisecond, true},
		{"near the max", 1900 * time.Millisecond, 0, 1900 * time.Millisecond, maxBackoff, true},
		{"at the max", maxBackoff, 0, maxBackoff, maxBackoff, false},
		{"retry-after", 500 * time.Millisecond, 1500 * time.Millisecond, 1500 * time.Millisecond, 1500 * time.Millisecond, false},
		{"retry-after beyond the max", 500 * time.Millisecond, time.Hour, maxBackoff, maxBackoff, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			varied := false
			for i := range 1000 {
				got := webhook.RetryWait(tt.backoff, tt.retryAfter, maxBackoff)
				if got < tt.least || got > tt.most {
					t.Fatalf("draw %d: RetryWait(%v, %v, %v) = %v, want %v to %v", i, tt.backoff, tt.retryAfter, maxBackoff, got, tt.least, tt.most)
				}
				varied = varied || got != tt.least
			}
			if varied != tt.varies {
				t.Errorf("RetryWait(%v, %v, %v) varied: %v in 1000 draws, want %v", tt.backoff, tt.retryAfter, maxBackoff, varied, tt.varies)
			}
		})
	}
}
