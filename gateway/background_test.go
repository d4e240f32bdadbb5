package gateway_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// bgGrace is the background grace of the tests below: longer than the
// connection TTL and the offline grace (1s each), so that a user shown
// away past them is shown so by the background grace.
const bgGrace = 4 * time.Second

// bgSystem starts a gateway with bgGrace, where alice watches bob.
func bgSystem(t *testing.T) (*systest.System, *client.Conn, func(query string) *client.Conn) {
	t.Helper()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{BackgroundGrace: bgGrace}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	dial := func(query string) *client.Conn {
		t.Helper()
		c, err := client.Dial(context.Background(), gw.WS+query, client.Options{})
		if err != nil {
			t.Fatalf("dial %s: %v", query, err)
		}
		t.Cleanup(func() { _ = c.Abort() })
		return c
	}
	alice := dial("?user=alice")
	t.Cleanup(systest.KeepAlive(alice, systest.Heartbeat))
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	// bob offline, before any device of his: an offline seen after this
	// is one of the test's.
	systest.AwaitStatus(t, alice, "bob", presence.Offline)
	return sys, alice, dial
}

func background(t *testing.T, c *client.Conn, graceMS ...int64) {
	t.Helper()
	m := protocol.ClientMessage{Type: protocol.TypeBackground}
	if len(graceMS) > 0 {
		m.GraceMS = &graceMS[0]
	}
	if err := c.Send(m); err != nil {
		t.Fatal(err)
	}
}

// awaitBob reads alice's frames until bob is status with platforms (JSON;
// "" for any), within wait, failing if bob is seen offline before when
// status is not offline. It returns when bob was seen so.
func awaitBob(t *testing.T, alice *client.Conn, wait time.Duration, status presence.Status, platforms string) time.Time {
	t.Helper()
	systest.Await(t, alice, wait, "bob "+string(status)+" "+platforms, func(m protocol.ServerMessage) bool {
		p, ok := presenceOf(m, "bob")
		if !ok {
			return false
		}
		if p.Status == presence.Offline && status != presence.Offline {
			t.Fatalf("bob seen offline while waiting for %s %s", status, platforms)
		}
		b, _ := json.Marshal(p.Platforms)
		return p.Status == status && (platforms == "" || string(b) == platforms)
	})
	return time.Now()
}

// TestBackgroundClose: a phone whose app went to the background shows
// its user away on "mobile: background"; when its socket then closes
// cleanly, and when it dies silently, the user stays away, not offline,
// until the background grace (clamped to the gateway's) has passed.
func TestBackgroundClose(t *testing.T) {
	t.Parallel()
	for _, death := range []bool{false, true} {
		name := map[bool]string{false: "clean close", true: "silent death"}[death]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, alice, dial := bgSystem(t)
			phone := dial("?user=bob&platform=mobile")
			awaitBob(t, alice, systest.EventTimeout, presence.Online, `{"mobile":"active"}`)
			background(t, phone, 1<<62) // more than the gateway's: its grace
			awaitBob(t, alice, systest.EventTimeout, presence.Away, `{"mobile":"background"}`)
			last := time.Now()
			if death {
				// Nothing more from the phone: the gateway finds it dead
				// after the TTL (1s).
			} else if err := phone.Close(); err != nil {
				t.Fatal(err)
			}
			seen := awaitBob(t, alice, bgGrace+10*time.Second, presence.Offline, "")
			if d := seen.Sub(last); d < bgGrace {
				t.Errorf("bob offline %v after the phone's last frame, want at least the background grace %v", d, bgGrace)
			}
		})
	}
}

// TestBackgroundReturn: a phone that comes back within the grace (a new
// connection) makes its user online again with no offline between, and
// the connection left behind ends at the grace's end with nothing seen.
// A grace asked for is taken; activity ends the background.
func TestBackgroundReturn(t *testing.T) {
	t.Parallel()
	sys, alice, dial := bgSystem(t)
	phone := dial("?user=bob&platform=mobile")
	awaitBob(t, alice, systest.EventTimeout, presence.Online, `{"mobile":"active"}`)
	background(t, phone, 2500)
	awaitBob(t, alice, systest.EventTimeout, presence.Away, `{"mobile":"background"}`)
	gone := phone.Hello.ConnID
	closed := time.Now()
	if err := phone.Close(); err != nil {
		t.Fatal(err)
	}
	back := dial("?user=bob&platform=mobile")
	defer systest.KeepAlive(back, systest.Heartbeat)()
	awaitBob(t, alice, systest.EventTimeout, presence.Online, `{"mobile":"active"}`)
	// The connection left behind goes at the end of its grace.
	deadline := time.Now().Add(2500*time.Millisecond + 10*time.Second)
	for {
		rec, err := sys.StatusOf("bob")
		if err != nil {
			t.Fatal(err)
		}
		ci, there := rec.Conns[gone]
		if !there {
			break
		}
		if !ci.Closing || !ci.Background {
			t.Fatalf("the phone's first connection after its close: %+v, want closing in the background", ci)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the phone's first connection still in bob's record %v after its close", time.Since(closed))
		}
		time.Sleep(50 * time.Millisecond) // polling the record, bounded by deadline
	}
	if d := time.Since(closed); d < 2500*time.Millisecond {
		t.Errorf("the connection left behind ended %v after its close, before the 2.5s grace it asked for", d)
	}
	// Nothing was seen of its end: the next change is the next frame.
	if err := back.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	awaitBob(t, alice, systest.EventTimeout, presence.Busy, `{"mobile":"active"}`)

	// Activity brings a connection back from the background: its close is
	// then an ordinary one, offline after the offline grace.
	background(t, back)
	awaitBob(t, alice, systest.EventTimeout, presence.Busy, `{"mobile":"background"}`)
	if err := back.Send(protocol.ClientMessage{Type: protocol.TypeActivity}); err != nil {
		t.Fatal(err)
	}
	awaitBob(t, alice, systest.EventTimeout, presence.Busy, `{"mobile":"active"}`)
	closed = time.Now()
	if err := back.Close(); err != nil {
		t.Fatal(err)
	}
	awaitBob(t, alice, systest.EventTimeout, presence.Offline, "")
	if d := time.Since(closed); d >= bgGrace {
		t.Errorf("offline %v after the close of a connection back from the background, want the offline grace (1s)", d)
	}
}

// TestBackgroundBadGrace: a grace that is not a positive whole number of
// milliseconds is answered bad_request, and changes nothing.
func TestBackgroundBadGrace(t *testing.T) {
	t.Parallel()
	sys, _, dial := bgSystem(t)
	bob := dial("?user=bob")
	for _, raw := range []string{
		`{"type":"background","id":"b1","grace_ms":0}`,
		`{"type":"background","id":"b2","grace_ms":-5}`,
		`{"type":"background","id":"b3","grace_ms":"soon"}`,
		`{"type":"background","id":"b4","grace_ms":1.5}`,
	} {
		if err := bob.SendRaw(ws.OpText, []byte(raw)); err != nil {
			t.Fatal(err)
		}
		m := systest.Await(t, bob, systest.EventTimeout, "an error", func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeError })
		if m.Code != protocol.CodeBadRequest || !strings.Contains(m.Message, "grace_ms") {
			t.Errorf("%s: %s %q, want bad_request naming grace_ms", raw, m.Code, m.Message)
		}
	}
	rec, err := sys.StatusOf("bob")
	if err != nil {
		t.Fatal(err)
	}
	if ci := rec.Conns[bob.Hello.ConnID]; ci.Background || ci.Idle {
		t.Errorf("bob's connection after refused backgrounds: %+v, want neither idle nor in the background", ci)
	}
}

// TestBackgroundGatewayStops: a gateway that stops keeps a background
// connection's grace no longer than the offline grace, and the others'
// clean closes no longer for it: the lease it hands over ends them all.
func TestBackgroundGatewayStops(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{BackgroundGrace: 30 * time.Second}})
	gw := sys.Gateway()
	other := sys.StartGateway(gateway.Config{BackgroundGrace: 30 * time.Second})
	sys.Mutual("alice", "bob", "carol")
	alice := sys.Dial(other, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	if err := alice.Subscribe("s", "bob", "carol"); err != nil {
		t.Fatal(err)
	}
	view := systest.NewView(t, alice)
	phone, err := client.Dial(context.Background(), gw.WS+"?user=bob&platform=mobile", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer phone.Abort()
	defer systest.KeepAlive(phone, systest.Heartbeat)()
	carol := sys.Dial(gw, "carol")
	defer systest.KeepAlive(carol, systest.Heartbeat)()
	view.Await("carol", presence.Online)
	background(t, phone)
	view.Await("bob", presence.Away)

	stopped := time.Now()
	sys.StopGateway(gw)
	view.Await("carol", presence.Offline)
	view.Await("bob", presence.Offline)
	if d := time.Since(stopped); d >= 30*time.Second {
		t.Errorf("bob and carol offline %v after their gateway stopped, want the offline grace and the lease's end, not the background grace", d)
	}
}
