package presence_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

func on(p presence.Platform, idle, closing bool) presence.ConnInfo {
	return presence.ConnInfo{Gateway: "g1", Platform: p, Idle: idle, Closing: closing}
}

func platformsJSON(t *testing.T, ps presence.Platforms) string {
	t.Helper()
	b, err := json.Marshal(ps)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRecordPlatforms: the platforms are those of the live connections
// that named one, active where one of them is; others see them only
// while the user is visible, and a change of what they see moves the
// public version (an event) without moving last_seen.
func TestRecordPlatforms(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	t1 := t0.Add(time.Minute)
	web, webIdle := on(presence.PlatformWeb, false, false), on(presence.PlatformWeb, true, false)
	mobile, mobileIdle := on(presence.PlatformMobile, false, false), on(presence.PlatformMobile, true, false)
	mobileClosing := on(presence.PlatformMobile, false, true)
	unnamed := presence.ConnInfo{Gateway: "g1"}
	phoneAway := presence.ConnInfo{Gateway: "g1", Platform: presence.PlatformMobile, Idle: true, Background: true}
	phoneGone := presence.ConnInfo{Gateway: "g1", Platform: presence.PlatformMobile, Idle: true, Background: true, Closing: true, ClosedAt: 1}

	for _, tt := range []struct {
		name       string
		prev, next presence.Record
		platforms  string // of next, as JSON
		public     string // what others see, as JSON
		pubMoved   bool
	}{
		{"no platform named", presence.Record{}, presence.Record{Conns: conns(unnamed)}, `{}`, `{}`, true},
		{"web", presence.Record{}, presence.Record{Conns: conns(web)}, `{"web":"active"}`, `{"web":"active"}`, true},
		{"a phone joins the web", presence.Record{Conns: conns(web)}, presence.Record{Conns: conns(web, mobileIdle)},
			`{"web":"active","mobile":"idle"}`, `{"web":"active","mobile":"idle"}`, true},
		{"one of two web tabs idle: web still active", presence.Record{Conns: conns(web, web)}, presence.Record{Conns: conns(web, webIdle)},
			`{"web":"active"}`, `{"web":"active"}`, false},
		{"an unnamed device joins: nothing public moves", presence.Record{Conns: conns(web)}, presence.Record{Conns: conns(web, unnamed)},
			`{"web":"active"}`, `{"web":"active"}`, false},
		{"a closing phone is not live", presence.Record{Conns: conns(web, mobile)}, presence.Record{Conns: conns(web, mobileClosing)},
			`{"web":"active"}`, `{"web":"active"}`, true},
		{"invisible: others see none", presence.Record{Conns: conns(web)}, presence.Record{Chosen: presence.Invisible, Conns: conns(web)},
			`{"web":"active"}`, `{}`, true},
		{"invisible, a phone joins: nothing public moves", presence.Record{Chosen: presence.Invisible, Conns: conns(web)},
			presence.Record{Chosen: presence.Invisible, Conns: conns(web, mobile)}, `{"web":"active","mobile":"active"}`, `{}`, false},
		{"a phone in the background", presence.Record{Conns: conns(web, mobile)}, presence.Record{Conns: conns(web, phoneAway)},
			`{"web":"active","mobile":"background"}`, `{"web":"active","mobile":"background"}`, true},
		{"its socket closed: still in the background, away", presence.Record{Conns: conns(phoneAway)}, presence.Record{Conns: conns(phoneGone)},
			`{"mobile":"background"}`, `{"mobile":"background"}`, false},
		{"another phone open and idle beside it", presence.Record{Conns: conns(phoneGone)}, presence.Record{Conns: conns(phoneGone, mobileIdle)},
			`{"mobile":"idle"}`, `{"mobile":"idle"}`, true},
		{"busy keeps its platforms", presence.Record{Conns: conns(mobile)}, presence.Record{Chosen: presence.Busy, Conns: conns(mobile)},
			`{"mobile":"active"}`, `{"mobile":"active"}`, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prev := presence.Record{}
			if tt.prev.Conns != nil {
				prev = finished(tt.prev, t0)
			}
			next := tt.next
			next.Finish(&prev, t1)
			if got := platformsJSON(t, next.Platforms); got != tt.platforms {
				t.Errorf("platforms = %s, want %s", got, tt.platforms)
			}
			if got := platformsJSON(t, next.Presence("u").Platforms); got != tt.public {
				t.Errorf("public platforms = %s, want %s", got, tt.public)
			}
			if moved := next.PubVer != prev.PubVer; moved != tt.pubMoved {
				t.Errorf("public version moved = %v, want %v", moved, tt.pubMoved)
			}
			if prev.Public == next.Public && prev.Updated != 0 && next.LastSeen != prev.LastSeen {
				t.Errorf("last_seen moved from %d to %d with the status unchanged", prev.LastSeen, next.LastSeen)
			}
			pub, _, _ := presence.Changes("u", &prev, &next, 2)
			if (pub != nil) != tt.pubMoved {
				t.Fatalf("public event = %+v, want one: %v", pub, tt.pubMoved)
			}
			if pub != nil && platformsJSON(t, pub.Platforms) != tt.public {
				t.Errorf("event platforms = %s, want %s", platformsJSON(t, pub.Platforms), tt.public)
			}
		})
	}
}

func TestPlatformsJSON(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{}`:                               `{}`,
		`null`:                             `{}`,
		`{"mobile":"active","web":"idle"}`: `{"web":"idle","mobile":"active"}`,
		`{"mobile":"background"}`:          `{"mobile":"background"}`,
		`{"desktop":"idle","web":"active","mobile":"active"}`: `{"web":"active","desktop":"idle","mobile":"active"}`,
	} {
		var ps presence.Platforms
		if err := json.Unmarshal([]byte(in), &ps); err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got := platformsJSON(t, ps); got != want {
			t.Errorf("%s read and written: %s, want %s", in, got, want)
		}
	}
	for _, bad := range []string{`{"tv":"active"}`, `{"web":"away"}`, `{"web":1}`, `["web"]`, `"web"`} {
		var ps presence.Platforms
		if err := json.Unmarshal([]byte(bad), &ps); err == nil {
			t.Errorf("%s: read as %s, want an error", bad, platformsJSON(t, ps))
		}
	}
	for _, p := range []string{"web", "desktop", "mobile"} {
		if !presence.ValidPlatform(p) || presence.Platform(p).Code().Platform() != presence.Platform(p) {
			t.Errorf("%s: not a platform, or its code does not give it back", p)
		}
	}
	for _, p := range []string{"", "Web", "ios", "tv"} {
		if presence.ValidPlatform(p) || presence.Platform(p).Code() != 0 {
			t.Errorf("%q taken as a platform", p)
		}
	}
}
