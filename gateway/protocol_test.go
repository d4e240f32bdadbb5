package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// isType matches a server message type.
func isType(typ string) func(protocol.ServerMessage) bool {
	return func(m protocol.ServerMessage) bool { return m.Type == typ }
}

// subscribe sends a subscribe and returns its presence_init and the denied
// frames that follow it.
func subscribe(t *testing.T, c *client.Conn, id string, users ...string) (protocol.ServerMessage, []protocol.ServerMessage) {
	t.Helper()
	if err := c.Subscribe(id, users...); err != nil {
		t.Fatal(err)
	}
	init := systest.Await(t, c, systest.EventTimeout, "presence_init "+id, func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == id
	})
	unique := map[string]bool{}
	for _, u := range users {
		unique[u] = true
	}
	var denied []protocol.ServerMessage
	for range users {
		if len(init.Users)+len(denied) >= len(unique) {
			break
		}
		m := systest.Await(t, c, systest.EventTimeout, "denied "+id, func(m protocol.ServerMessage) bool {
			return m.Type != protocol.TypeSelf && m.Type != protocol.TypePresenceBatch
		})
		if m.Type != protocol.TypeDenied || m.ID != id {
			t.Fatalf("after presence_init: got %+v, want denied with id %q", m, id)
		}
		denied = append(denied, m)
	}
	return init, denied
}

func TestHello(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	c := sys.Dial(sys.Gateway(), "alice", "ios")
	h := c.Hello
	if h.UserID != "alice" || h.ConnID == "" || h.Status != presence.Online {
		t.Errorf("hello = %+v", h)
	}
	if h.HeartbeatIntervalMS != systest.Heartbeat.Milliseconds() || h.TTLMS != systest.TTL.Milliseconds() {
		t.Errorf("hello timings = %d/%d, want %d/%d", h.HeartbeatIntervalMS, h.TTLMS, systest.Heartbeat.Milliseconds(), systest.TTL.Milliseconds())
	}
	rec, err := sys.StatusOf("alice")
	if err != nil {
		t.Fatal(err)
	}
	ci, ok := rec.Conns[h.ConnID]
	if !ok || ci.Device != "ios" || ci.Gateway != sys.Gateway().ID() {
		t.Errorf("record conns = %+v", rec.Conns)
	}
}

func TestHelloCarriesChosenStatus(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	a := sys.Dial(gw, "alice")
	if err := a.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, a, presence.Busy, 1)
	b := sys.Dial(gw, "alice", "phone")
	if b.Hello.Status != presence.Busy {
		t.Errorf("second device hello status = %q, want busy", b.Hello.Status)
	}
	systest.AwaitSelf(t, a, presence.Busy, 2)
	systest.AwaitSelf(t, b, presence.Busy, 2)
}

func TestErrorsKeepSocketOpen(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	c := sys.Dial(sys.Gateway(), "alice")
	tests := []struct {
		name string
		raw  string
		code string
		id   string
	}{
		{"not JSON", `hello`, protocol.CodeBadRequest, ""},
		{"truncated JSON", `{"type":"heartbeat"`, protocol.CodeBadRequest, ""},
		{"array", `[1,2]`, protocol.CodeBadRequest, ""},
		{"no type", `{"id":"x"}`, protocol.CodeBadRequest, "x"},
		{"type not a string", `{"type":5}`, protocol.CodeBadRequest, ""},
		{"unknown type", `{"type":"dance","id":"u1"}`, protocol.CodeUnknownType, "u1"},
		{"bad status", `{"type":"set_status","status":"offline","id":"s1"}`, protocol.CodeInvalidStatus, "s1"},
		{"status not a string", `{"type":"set_status","status":1,"id":"s2"}`, protocol.CodeBadRequest, "s2"},
		{"user_ids not an array", `{"type":"subscribe","user_ids":"bob","id":"b1"}`, protocol.CodeBadRequest, "b1"},
		{"subscribe nothing", `{"type":"subscribe","id":"b2"}`, protocol.CodeBadRequest, "b2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := c.SendRaw(ws.OpText, []byte(tt.raw)); err != nil {
				t.Fatal(err)
			}
			m := systest.Await(t, c, systest.EventTimeout, "error", isType(protocol.TypeError))
			if m.Code != tt.code || m.ID != tt.id || m.Message == "" {
				t.Errorf("got error %+v, want code %q id %q and a message", m, tt.code, tt.id)
			}
		})
	}
	// The socket is still open and the user still online.
	if err := c.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, c, presence.Away, 1)
}

func TestSubscribeAnswers(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{MaxSubscriptions: 3}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob", "carol", "dave")
	sys.Follow("alice", "erin") // one way: not mutual
	bob := sys.Dial(gw, "bob")
	defer systest.KeepAlive(bob, systest.Heartbeat)()
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()

	init, denied := subscribe(t, alice, "q1", "bob", "carol", "erin", "bad id!", "bob")
	if len(init.Users) != 2 || init.Users[0].UserID != "bob" || init.Users[0].Status != presence.Online ||
		init.Users[1].UserID != "carol" || init.Users[1].Status != presence.Offline {
		t.Errorf("init users = %+v", init.Users)
	}
	want := map[string]string{"erin": protocol.ReasonNotMutualFollowers, "bad id!": protocol.ReasonInvalidUserID}
	if len(denied) != len(want) {
		t.Fatalf("denied = %+v, want %v", denied, want)
	}
	for _, d := range denied {
		if want[d.UserID] != d.Reason {
			t.Errorf("denied %s: %s, want %s", d.UserID, d.Reason, want[d.UserID])
		}
	}

	// Two held, room for one more: the socket limit denies the fourth.
	_, denied = subscribe(t, alice, "q2", "alice", "dave")
	if len(denied) != 1 || denied[0].UserID != "dave" || denied[0].Reason != protocol.ReasonTooManySubscriptions {
		t.Errorf("denied = %+v, want dave too_many_subscriptions", denied)
	}

	// "all" needs the everyone policy.
	if err := alice.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, All: true, ID: "q3"}); err != nil {
		t.Fatal(err)
	}
	d := systest.Await(t, alice, systest.EventTimeout, "denied *", isType(protocol.TypeDenied))
	if d.UserID != "*" || d.Reason != protocol.ReasonNotAllowed || d.ID != "q3" {
		t.Errorf("denied = %+v, want * not_allowed q3", d)
	}

	// Too many ids in one message.
	ids := make([]string, gateway.DefaultMaxSubscribeIDs+1)
	for i := range ids {
		ids[i] = fmt.Sprintf("u%d", i)
	}
	if err := alice.Subscribe("q4", ids...); err != nil {
		t.Fatal(err)
	}
	e := systest.Await(t, alice, systest.EventTimeout, "error", isType(protocol.TypeError))
	if e.Code != protocol.CodeBadRequest || e.ID != "q4" {
		t.Errorf("error = %+v", e)
	}
}

func TestUnsubscribeStopsUpdates(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob", "carol")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	subscribe(t, alice, "s", "bob", "carol")
	if err := alice.Send(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, UserIDs: []string{"bob"}}); err != nil {
		t.Fatal(err)
	}
	// The unsubscribe has no answer; a heartbeat round trip through the
	// same socket orders it before bob connects: a subscribe answer does.
	subscribe(t, alice, "sync", "carol")

	bob := sys.Dial(gw, "bob")
	defer systest.KeepAlive(bob, systest.Heartbeat)()
	systest.AwaitSelf(t, bob, presence.Online, 1)
	carol := sys.Dial(gw, "carol")
	defer systest.KeepAlive(carol, systest.Heartbeat)()
	// Carol connected after bob, so bob's change, if it were delivered,
	// would arrive first.
	systest.Await(t, alice, systest.EventTimeout, "carol online", func(m protocol.ServerMessage) bool {
		for _, p := range m.Updates {
			if p.UserID == "bob" {
				t.Fatalf("got an update for bob after unsubscribing: %+v", m)
			}
		}
		for _, p := range m.Updates {
			if p.UserID == "carol" && p.Status == presence.Online {
				return true
			}
		}
		return false
	})
}

func TestBatchesCoalesce(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{BatchInterval: 500 * time.Millisecond}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob", "carol")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	subscribe(t, alice, "s", "bob", "carol")
	bob := sys.Dial(gw, "bob")
	defer systest.KeepAlive(bob, systest.Heartbeat)()
	carol := sys.Dial(gw, "carol")
	defer systest.KeepAlive(carol, systest.Heartbeat)()
	v := systest.NewView(t, alice)
	v.Await("bob", presence.Online)
	v.Await("carol", presence.Online)
	before := len(v.Frames)

	const changes = 20
	statuses := []string{"busy", "away", "online"}
	for i := range changes {
		if err := bob.SetStatus(statuses[i%3]); err != nil {
			t.Fatal(err)
		}
		if err := carol.SetStatus(statuses[(i+1)%3]); err != nil {
			t.Fatal(err)
		}
	}
	final := map[string]presence.Status{"bob": presence.Status(statuses[(changes-1)%3]), "carol": presence.Status(statuses[changes%3])}
	v.Until(10*time.Second, "final statuses", func(v *systest.View) bool {
		b, _ := v.Presence("bob")
		c, _ := v.Presence("carol")
		return b.Status == final["bob"] && c.Status == final["carol"]
	})
	frames := 0
	for _, m := range v.Frames {
		if m.Type != protocol.TypePresenceBatch {
			continue
		}
		seen := map[string]bool{}
		for _, p := range m.Updates {
			if seen[p.UserID] {
				t.Errorf("batch holds %s twice: %+v", p.UserID, m.Updates)
			}
			seen[p.UserID] = true
		}
	}
	for _, m := range v.Frames[before:] {
		if m.Type == protocol.TypePresenceBatch {
			frames++
		}
	}
	// 40 changes written within a few batch intervals arrive in far fewer
	// frames.
	if frames >= changes {
		t.Errorf("%d changes of two users arrived in %d frames; want them coalesced", 2*changes, frames)
	}
}

func TestMultiDeviceSelf(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw2 := sys.StartGateway(gateway.Config{})
	web := sys.Dial(sys.Gateway(), "alice", "web")
	defer systest.KeepAlive(web, systest.Heartbeat)()
	systest.AwaitSelf(t, web, presence.Online, 1)
	phone := sys.Dial(gw2, "alice", "phone")
	defer systest.KeepAlive(phone, systest.Heartbeat)()
	systest.AwaitSelf(t, web, presence.Online, 2)
	systest.AwaitSelf(t, phone, presence.Online, 2)

	if err := phone.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, web, presence.Invisible, 2)
	systest.AwaitSelf(t, phone, presence.Invisible, 2)
	if err := phone.Close(); err != nil {
		t.Fatal(err)
	}
	// The closed device stops counting at once; the user stays invisible.
	systest.AwaitSelf(t, web, presence.Invisible, 1)
}

func TestIdleAndActivity(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	subscribe(t, alice, "s", "bob")
	web := sys.Dial(gw, "bob", "web")
	defer systest.KeepAlive(web, systest.Heartbeat)()
	phone := sys.Dial(gw, "bob", "phone")
	defer systest.KeepAlive(phone, systest.Heartbeat)()
	systest.AwaitStatus(t, alice, "bob", presence.Online)

	idle := protocol.ClientMessage{Type: protocol.TypeIdle}
	if err := web.Send(idle); err != nil {
		t.Fatal(err)
	}
	// One device idle: still online. Both idle: away.
	natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		rec, err := sys.StatusOf("bob")
		if err != nil {
			return err
		}
		for _, c := range rec.Conns {
			if c.Device == "web" && c.Idle {
				return nil
			}
		}
		return errors.New("web not idle yet")
	})
	if rec, _ := sys.StatusOf("bob"); rec.Status != presence.Online {
		t.Fatalf("one device idle: status %q, want online", rec.Status)
	}
	if err := phone.Send(idle); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Away)
	systest.AwaitSelf(t, web, presence.Away, 2)

	if err := web.Send(protocol.ClientMessage{Type: protocol.TypeActivity}); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Online)
}

func TestAwayAfterInactivity(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{AwayAfter: time.Second}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	subscribe(t, alice, "s", "bob")
	bob := sys.Dial(gw, "bob")
	defer systest.KeepAlive(bob, systest.Heartbeat)() // heartbeats are not activity
	systest.AwaitStatus(t, alice, "bob", presence.Online)
	systest.AwaitStatus(t, alice, "bob", presence.Away)
	if err := bob.Send(protocol.ClientMessage{Type: protocol.TypeActivity}); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Online)
	// A chosen away stays away whatever the activity.
	if err := bob.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Away)
	if err := bob.SetStatus("online"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Online)
}

func TestOfflineGraceAndReload(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{OfflineGrace: 2 * time.Second}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	subscribe(t, alice, "s", "bob")

	// A reload: close and connect again within the grace. Watchers never
	// see offline.
	bob := sys.Dial(gw, "bob")
	systest.AwaitStatus(t, alice, "bob", presence.Online)
	if err := bob.Close(); err != nil {
		t.Fatal(err)
	}
	bob = sys.Dial(gw, "bob")
	stop := systest.KeepAlive(bob, systest.Heartbeat)
	// Wait past the grace of the first connection: its key is gone.
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		rec, err := sys.StatusOf("bob")
		if err != nil {
			return err
		}
		if len(rec.Conns) != 1 {
			return fmt.Errorf("%d connections in the record", len(rec.Conns))
		}
		return nil
	})
	stop()

	// A real leave: offline after the grace, not before.
	closed := time.Now()
	if err := bob.Close(); err != nil {
		t.Fatal(err)
	}
	var offline presence.Presence
	systest.Await(t, alice, 10*time.Second, "bob offline", func(m protocol.ServerMessage) bool {
		for _, p := range m.Updates {
			if p.UserID == "bob" && p.Status == presence.Offline {
				offline = p
				return true
			}
		}
		return false
	})
	if took := time.Since(closed); took < 2*time.Second-300*time.Millisecond || took > 2*time.Second+2*time.Second {
		t.Errorf("offline %v after a clean close; want the 2s grace, plus at most 2s", took)
	}
	// bob was last seen when he closed, not when the grace ended.
	if seen := time.Unix(offline.LastSeen, 0); seen.Before(closed.Truncate(time.Second)) || seen.After(closed.Add(time.Second)) {
		t.Errorf("last_seen %v after a close at %v; want the time of the close", seen, closed)
	}
}

func TestSilentDeath(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	subscribe(t, alice, "s", "bob")
	bob := sys.Dial(gw, "bob")
	stop := systest.KeepAlive(bob, systest.Heartbeat)
	systest.AwaitStatus(t, alice, "bob", presence.Online)
	// Bob's device goes silent: the socket stays open, nothing arrives.
	stop()
	silent := time.Now()
	systest.AwaitStatus(t, alice, "bob", presence.Offline)
	if took := time.Since(silent); took > systest.TTL+2*time.Second {
		t.Errorf("offline %v after the last frame; want within TTL (%v) plus 2s", took, systest.TTL)
	}
	// The gateway closed the dead socket.
	_ = bob.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, _, err := bob.Read(); err != nil {
			if errors.Is(err, io.EOF) || strings.Contains(err.Error(), "reset") || strings.Contains(err.Error(), "EOF") {
				break
			}
			var ce *client.CloseError
			if errors.As(err, &ce) {
				break
			}
			t.Fatalf("dead socket: %v, want it closed by the gateway", err)
		}
	}
}

func TestPingCountsAsHeartbeat(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	c := sys.Dial(sys.Gateway(), "alice")
	deadline := time.Now().Add(3 * systest.TTL)
	for time.Now().Before(deadline) {
		if err := c.SendRaw(ws.OpPing, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		// The pong is answered by the client's reader; wait for the next
		// frame or the heartbeat interval.
		_ = c.SetReadDeadline(time.Now().Add(systest.Heartbeat))
		if _, _, err := c.Read(); err != nil {
			var ce *client.CloseError
			if errors.As(err, &ce) {
				t.Fatalf("closed while pinging: %v", err)
			}
		}
	}
	rec, err := sys.StatusOf("alice")
	if err != nil || rec.Status != presence.Online {
		t.Fatalf("after pings for 3 TTLs: %+v, %v; want online", rec, err)
	}
}

// TestPingAnsweredDuringAWrite: a ping that comes while a frame is being
// written to the socket is answered once that write is done, with a pong
// that carries the ping's payload.
func TestPingAnsweredDuringAWrite(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{ConnTTL: time.Minute}})
	gw := sys.Gateway()
	c := sys.Dial(gw, "alice")
	rest, err := c.TakeReading(nil)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(io.MultiReader(bytes.NewReader(rest), c.NetConn()))
	release := gw.HoldWrites("alice", c.Hello.ConnID)
	if release == nil {
		t.Fatal("the gateway holds no connection of alice")
	}
	defer release()
	before := gw.Heartbeats()
	if err := c.SendRaw(ws.OpPing, []byte("are you there")); err != nil {
		t.Fatal(err)
	}
	// The gateway has read the ping while the socket is busy.
	natstest.CheckFor(t, systest.EventTimeout, 5*time.Millisecond, func() error {
		if gw.Heartbeats() == before {
			return errors.New("ping not read yet")
		}
		return nil
	})
	release()
	_ = c.NetConn().SetReadDeadline(time.Now().Add(systest.EventTimeout))
	for {
		h, err := ws.ReadHeader(br)
		if err != nil {
			t.Fatalf("no pong: %v", err)
		}
		payload := make([]byte, h.Length) // the gateway's own frames: small
		if _, err := io.ReadFull(br, payload); err != nil {
			t.Fatalf("no pong: %v", err)
		}
		if h.OpCode == ws.OpText {
			continue // the user's own state
		}
		if h.OpCode != ws.OpPong || string(payload) != "are you there" {
			t.Fatalf("got %v frame %q, want the pong of the ping", h.OpCode, payload)
		}
		return
	}
}

func TestGatewayStopClosesWith1001(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw2 := sys.StartGateway(gateway.Config{})
	c := sys.Dial(gw2, "alice")
	go sys.StopGateway(gw2)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := c.Read()
		if err == nil {
			continue
		}
		var ce *client.CloseError
		if !errors.As(err, &ce) || ce.Code != ws.StatusGoingAway {
			t.Fatalf("got %v, want close 1001", err)
		}
		return
	}
}

func TestUpgradeRefusals(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	tests := []struct {
		name, query string
		status      int
	}{
		{"no identity", "", http.StatusUnauthorized},
		{"bad user id", "?user=al%20ice", http.StatusBadRequest},
		{"long user id", "?user=" + strings.Repeat("a", 65), http.StatusBadRequest},
		{"bad device", "?user=alice&device=" + strings.Repeat("d", 33), http.StatusBadRequest},
		{"unknown platform", "?user=alice&platform=tv", http.StatusBadRequest},
		{"empty platform", "?user=alice&platform=", http.StatusBadRequest},
		{"token without a verifier", "?token=abc", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.Dial(context.Background(), gw.WS+tt.query, client.Options{})
			var he *client.HandshakeError
			if !errors.As(err, &he) || he.Status != tt.status {
				t.Fatalf("dial: %v, want HTTP %d", err, tt.status)
			}
			// The error carries the gateway's reason, not the response.
			if he.Body == "" || strings.Contains(he.Body, "HTTP/1.1") {
				t.Fatalf("refusal body %q, want the reason alone", he.Body)
			}
		})
	}
}

// api calls the HTTP API as user (dev auth) and decodes the answer.
func api(t *testing.T, method, url, user string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	if user != "" {
		url += sep + "user=" + user
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") && !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("%s %s: content type %q", method, url, ct)
	}
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, url, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

func TestHTTPAPI(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob", "carol", "dave")
	sys.Follow("alice", "erin")
	bob := sys.Dial(gw, "bob")
	defer systest.KeepAlive(bob, systest.Heartbeat)()
	carol := sys.Dial(gw, "carol")
	carolStop := systest.KeepAlive(carol, systest.Heartbeat)
	if err := carol.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, carol, presence.Invisible, 1)
	dave := sys.Dial(gw, "dave")
	if err := dave.Close(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		rec, err := sys.StatusOf("dave")
		if err != nil || rec.Status != presence.Offline || rec.LastSeen == 0 {
			return fmt.Errorf("dave: %+v %v", rec, err)
		}
		return nil
	})

	var p presence.Presence
	if st := api(t, "GET", gw.HTTP+"/api/presence/users/bob", "alice", nil, &p); st != 200 || p.Status != presence.Online || p.UserID != "bob" {
		t.Errorf("GET bob: %d %+v", st, p)
	}
	p = presence.Presence{}
	if st := api(t, "GET", gw.HTTP+"/api/presence/users/carol", "alice", nil, &p); st != 200 || p.Status != presence.Offline {
		t.Errorf("GET invisible carol: %d %+v, want offline", st, p)
	}
	var e struct{ Error, Message string }
	if st := api(t, "GET", gw.HTTP+"/api/presence/users/erin", "alice", nil, &e); st != 403 || e.Error != protocol.ReasonNotMutualFollowers {
		t.Errorf("GET erin: %d %+v, want 403 not_mutual_followers", st, e)
	}
	if st := api(t, "GET", gw.HTTP+"/api/presence/users/b%20b", "alice", nil, &e); st != 400 {
		t.Errorf("GET bad id: %d %+v, want 400", st, e)
	}
	if st := api(t, "GET", gw.HTTP+"/api/presence/users/bob", "", nil, &e); st != 401 || e.Error != "unauthorized" {
		t.Errorf("GET without identity: %d %+v, want 401", st, e)
	}

	var q struct {
		Users  []presence.Presence
		Denied []struct{ UserID, Reason string } `json:"denied"`
	}
	if st := api(t, "POST", gw.HTTP+"/api/presence/query", "alice", map[string]any{"user_ids": []string{"bob", "erin", "dave", "x y"}}, &q); st != 200 {
		t.Fatalf("query: %d", st)
	}
	if len(q.Users) != 2 || q.Users[0].UserID != "bob" || q.Users[1].UserID != "dave" || q.Users[1].Status != presence.Offline || q.Users[1].LastSeen == 0 {
		t.Errorf("query users = %+v", q.Users)
	}
	if len(q.Denied) != 2 {
		t.Errorf("query denied = %+v", q.Denied)
	}
	tooMany := make([]string, gateway.DefaultMaxQueryIDs+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("u%d", i)
	}
	if st := api(t, "POST", gw.HTTP+"/api/presence/query", "alice", map[string]any{"user_ids": tooMany}, &e); st != 400 {
		t.Errorf("query of %d ids: %d, want 400", len(tooMany), st)
	}
	if st := api(t, "POST", gw.HTTP+"/api/presence/query", "alice", "nope", &e); st != 400 {
		t.Errorf("query with a bad body: %d, want 400", st)
	}

	var f struct{ Friends []presence.Presence }
	if st := api(t, "GET", gw.HTTP+"/api/presence/friends", "alice", nil, &f); st != 200 {
		t.Fatalf("friends: %d", st)
	}
	// Online first (bob), then by last_seen, newest first; invisible carol
	// looks offline and erin is not a mutual follower.
	var got []string
	for _, x := range f.Friends {
		got = append(got, x.UserID+":"+string(x.Status))
	}
	if len(got) != 3 || got[0] != "bob:online" || f.Friends[1].Status != presence.Offline || f.Friends[2].Status != presence.Offline {
		t.Errorf("friends = %v", got)
	}
	if f.Friends[1].LastSeen < f.Friends[2].LastSeen {
		t.Errorf("friends not ordered by last_seen: %+v", f.Friends)
	}
	if st := api(t, "GET", gw.HTTP+"/api/presence/friends?limit=1", "alice", nil, &f); st != 200 || len(f.Friends) != 1 {
		t.Errorf("friends?limit=1: %d %+v", st, f.Friends)
	}
	if st := api(t, "GET", gw.HTTP+"/api/presence/friends?limit=0", "alice", nil, &e); st != 400 {
		t.Errorf("friends?limit=0: %d, want 400", st)
	}
	if st := api(t, "GET", gw.HTTP+"/api/presence/online", "alice", nil, &e); st != 403 || e.Error != protocol.ReasonNotAllowed {
		t.Errorf("online under the mutual policy: %d %+v, want 403 not_allowed", st, e)
	}
	if st := api(t, "GET", gw.HTTP+"/healthz", "", nil, nil); st != 200 {
		t.Errorf("healthz: %d", st)
	}
	if st := api(t, "GET", gw.HTTP+"/readyz", "", nil, nil); st != 200 {
		t.Errorf("readyz: %d", st)
	}
	resp, err := http.Get(gw.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(body, []byte("greendot_gateway_connections ")) {
		t.Errorf("metrics lack greendot_gateway_connections")
	}
	carolStop()
}
