package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// awaitCustom reads c's frames until user's presence carries the custom
// status want (nil: none) with status, and returns it.
func awaitCustom(t *testing.T, c *client.Conn, user string, status presence.Status, want *presence.Custom) presence.Presence {
	t.Helper()
	var got presence.Presence
	systest.Await(t, c, systest.EventTimeout, user+" "+string(status)+" with custom status "+customString(want), func(m protocol.ServerMessage) bool {
		p, ok := presenceOf(m, user)
		got = p
		return ok && p.Status == status && p.Custom.Equal(want)
	})
	return got
}

func customString(c *presence.Custom) string {
	if c == nil {
		return "none"
	}
	return strings.Join([]string{c.Text, c.Emoji, time.Unix(c.ExpiresAt, 0).UTC().Format(time.RFC3339)}, " ")
}

// TestCustomStatus: a custom status set on one device is shown to
// watchers (presence_batch, a new subscription's presence_init, the HTTP
// API) and to the user's other devices (self), hidden while the user is
// invisible, kept while they are offline, and cleared by an empty one.
func TestCustomStatus(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	web := sys.Dial(gw, "bob", "laptop")
	phone := sys.Dial(gw, "bob", "phone")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(web, systest.Heartbeat)()
	defer systest.KeepAlive(phone, systest.Heartbeat)()
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	awaitCustom(t, alice, "bob", presence.Online, nil)

	expires := time.Now().Add(time.Hour).Truncate(time.Second)
	meeting := &presence.Custom{Text: "In a meeting, back at 3 <b>&</b>", Emoji: "📅", ExpiresAt: expires.Unix()}
	if err := web.SetCustomStatus(meeting.Text, meeting.Emoji, expires); err != nil {
		t.Fatal(err)
	}
	awaitCustom(t, alice, "bob", presence.Online, meeting)
	systest.Await(t, phone, systest.EventTimeout, "self with the custom status", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeSelf && m.Custom.Equal(meeting)
	})
	var api presence.Presence
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob?user=alice", nil, nil, &api); st != http.StatusOK || !api.Custom.Equal(meeting) {
		t.Errorf("GET users/bob: %d %+v, want the custom status %s", st, api, customString(meeting))
	}
	// A new watcher, and a new device of bob's, are told at once.
	carol := sys.Dial(gw, "alice", "tablet")
	defer systest.KeepAlive(carol, systest.Heartbeat)()
	if err := carol.Subscribe("s2", "bob"); err != nil {
		t.Fatal(err)
	}
	awaitCustom(t, carol, "bob", presence.Online, meeting)
	tablet := sys.Dial(gw, "bob", "tablet")
	systest.Await(t, tablet, systest.EventTimeout, "self with the custom status on connect", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeSelf && m.Custom.Equal(meeting)
	})
	_ = tablet.Close()

	// Invisible shows nothing; the user's own devices still see it.
	if err := web.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	awaitCustom(t, alice, "bob", presence.Offline, nil)
	systest.Await(t, phone, systest.EventTimeout, "self invisible with the custom status", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeSelf && m.Status == presence.Invisible && m.Custom.Equal(meeting)
	})
	if err := web.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	awaitCustom(t, alice, "bob", presence.Busy, meeting)

	// Offline, it stays, as the user's status choice does.
	_ = web.Close()
	_ = phone.Close()
	awaitCustom(t, alice, "bob", presence.Offline, meeting)

	// Cleared by an empty one, from a device that comes back.
	back := sys.Dial(gw, "bob", "laptop")
	defer systest.KeepAlive(back, systest.Heartbeat)()
	awaitCustom(t, alice, "bob", presence.Busy, meeting)
	if err := back.SetCustomStatus("", "", time.Time{}); err != nil {
		t.Fatal(err)
	}
	awaitCustom(t, alice, "bob", presence.Busy, nil)
	rec, err := sys.StatusOf("bob")
	if err != nil || rec.Custom != nil {
		t.Errorf("bob's record: custom %+v (err %v), want none", rec.Custom, err)
	}
}

// TestCustomStatusRefused: every custom status a user may not set is
// answered with invalid_custom_status (or bad_request, for a field of the
// wrong type) naming what is wrong, and changes nothing.
func TestCustomStatusRefused(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	bob := sys.Dial(gw, "bob")
	kept := &presence.Custom{Text: "On call", Emoji: ":phone:"}
	if err := bob.SetCustomStatus(kept.Text, kept.Emoji, time.Time{}); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, bob, systest.EventTimeout, "self with the custom status", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeSelf && m.Custom.Equal(kept)
	})
	now := time.Now().Unix()
	for _, tc := range []struct {
		name, raw, code, says string
	}{
		{"text too long", `{"type":"set_custom_status","id":"1","text":"` + strings.Repeat("é", 101) + `"}`, protocol.CodeInvalidCustom, "text has 101 characters, at most 100"},
		{"text with a line break", `{"type":"set_custom_status","id":"2","text":"a\nb"}`, protocol.CodeInvalidCustom, "text has a control character"},
		{"emoji too long", `{"type":"set_custom_status","id":"3","emoji":"` + strings.Repeat("x", 17) + `"}`, protocol.CodeInvalidCustom, "emoji has 17 characters, at most 16"},
		{"emoji with a space", `{"type":"set_custom_status","id":"4","emoji":": x:"}`, protocol.CodeInvalidCustom, "emoji has a space"},
		{"expiry in the past", `{"type":"set_custom_status","id":"5","text":"x","expires_at":` + itoa(now-10) + `}`, protocol.CodeInvalidCustom, "is not in the future"},
		{"expiry too far", `{"type":"set_custom_status","id":"6","text":"x","expires_at":` + itoa(now+400*86400) + `}`, protocol.CodeInvalidCustom, "more than 366 days ahead"},
		{"expiry alone", `{"type":"set_custom_status","id":"7","expires_at":` + itoa(now+60) + `}`, protocol.CodeInvalidCustom, "expires_at without text or emoji"},
		{"negative expiry", `{"type":"set_custom_status","id":"8","text":"x","expires_at":-1}`, protocol.CodeInvalidCustom, "want unix seconds"},
		{"text not a string", `{"type":"set_custom_status","id":"9","text":1}`, protocol.CodeBadRequest, `field "text" must be a string`},
		{"expiry not a number", `{"type":"set_custom_status","id":"10","text":"x","expires_at":"soon"}`, protocol.CodeBadRequest, `field "expires_at" must be a whole number of unix seconds`},
	} {
		if err := bob.SendRaw(ws.OpText, []byte(tc.raw)); err != nil {
			t.Fatal(err)
		}
		id := tc.raw[strings.Index(tc.raw, `"id":"`)+6:]
		id = id[:strings.IndexByte(id, '"')]
		m := systest.Await(t, bob, systest.EventTimeout, tc.name+": error", func(m protocol.ServerMessage) bool {
			return m.Type == protocol.TypeError && m.ID == id
		})
		if m.Code != tc.code || !strings.Contains(m.Message, tc.says) {
			t.Errorf("%s: error %s %q, want %s saying %q", tc.name, m.Code, m.Message, tc.code, tc.says)
		}
	}
	rec, err := sys.StatusOf("bob")
	if err != nil || !rec.Custom.Equal(kept) {
		t.Errorf("bob's record: custom %+v (err %v), want %+v kept", rec.Custom, err, kept)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestCustomStatusExpires: a custom status with an expiry is cleared by
// the server when it ends, with nobody of the user's online: watchers see
// it go. A reaper down at the expiry clears it when it comes back, from
// the timer's end kept for it; and one whose timer's end is gone, at its
// start-up sweep.
func TestCustomStatusExpires(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	set := func(text string, in time.Duration) *presence.Custom {
		t.Helper()
		bob := sys.Dial(gw, "bob")
		expires := time.Now().Add(in).Truncate(time.Second).Add(time.Second)
		c := &presence.Custom{Text: text, ExpiresAt: expires.Unix()}
		if err := bob.SetCustomStatus(c.Text, "", expires); err != nil {
			t.Fatal(err)
		}
		awaitCustom(t, alice, "bob", presence.Online, c)
		if err := bob.Close(); err != nil {
			t.Fatal(err)
		}
		awaitCustom(t, alice, "bob", presence.Offline, c)
		return c
	}

	set("Lunch", time.Second)
	awaitCustom(t, alice, "bob", presence.Offline, nil)
	if rec, err := sys.StatusOf("bob"); err != nil || rec.Custom != nil {
		t.Errorf("bob's record after the expiry: custom %+v (err %v), want none", rec.Custom, err)
	}

	// With the reaper down at the expiry.
	c := set("Gym", time.Second)
	sys.StopReaper()
	timers, err := sys.Store.JetStream().KeyValue(context.Background(), presence.TimersBucket)
	if err != nil {
		t.Fatal(err)
	}
	awaitKeyEnded(t, timers, presence.CustomTimerKey("bob"))
	if rec, err := sys.StatusOf("bob"); err != nil || !rec.Custom.Equal(c) {
		t.Fatalf("bob's record with no reaper: custom %+v (err %v), want it still there", rec.Custom, err)
	}
	// Its readers no longer show it meanwhile.
	var api presence.Presence
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob?user=alice", nil, nil, &api); st != http.StatusOK || api.Custom != nil {
		t.Errorf("GET users/bob after the expiry: %d %+v, want no custom status", st, api)
	}
	sys.StartReaper()
	awaitCustom(t, alice, "bob", presence.Offline, nil)

	// An expired custom status whose timer's end is gone: the sweep.
	sys.StopReaper()
	expired := &presence.Custom{Text: "Old", ExpiresAt: time.Now().Add(-time.Minute).Unix()}
	if _, _, _, err := sys.Store.UpdateStatus(context.Background(), "bob", func(r *presence.Record) error {
		r.Custom = expired
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sys.StartReaper()
	if rec, err := sys.StatusOf("bob"); err != nil || rec.Custom != nil {
		t.Errorf("bob's record after the reaper's start: custom %+v (err %v), want none", rec.Custom, err)
	}
}

// awaitKeyEnded waits until key is gone from kv (its TTL ended), watching it.
func awaitKeyEnded(t *testing.T, kv jetstream.KeyValue, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), systest.EventTimeout)
	defer cancel()
	w, err := kv.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e := <-w.Updates():
			if e != nil && e.Operation() != jetstream.KeyValuePut {
				return
			}
		case <-ctx.Done():
			_, err := kv.Get(context.Background(), key)
			t.Fatalf("timer %s still there after %v (get: %v)", key, systest.EventTimeout, errors.Join(err, ctx.Err()))
		}
	}
}
