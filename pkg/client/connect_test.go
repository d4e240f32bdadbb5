package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/tcpproxy"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// waitFor bounds every wait of these tests: long, for a loaded machine.
const waitFor = 30 * time.Second

// fast reconnects quickly, so that tests do not wait out real backoffs.
var fast = client.Config{
	Backoff:     client.Backoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond},
	DrainJitter: 50 * time.Millisecond,
}

// connect connects user to g with dev auth; the client is closed when the
// test ends.
func connect(t *testing.T, g *systest.Gateway, user string, cfg client.Config) *events {
	t.Helper()
	return connectURL(t, g.WS, user, cfg)
}

// connectURL is connect to a WebSocket URL: a made-up gateway's, or a
// proxy's.
func connectURL(t *testing.T, url, user string, cfg client.Config) *events {
	t.Helper()
	cfg.User = user
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := client.Connect(ctx, url, cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", user, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &events{t: t, c: c, name: user}
}

// bobWatchesAlice starts a system where alice and bob follow each other,
// connects both with cfg, and returns once bob sees alice online.
func bobWatchesAlice(t *testing.T, cfg client.Config) (*systest.System, *events, *events) {
	t.Helper()
	sys := systest.Start(t, systest.Options{})
	sys.Mutual("alice", "bob")
	g := sys.Gateway()
	alice := connect(t, g, "alice", cfg)
	bob := connect(t, g, "bob", cfg)
	if err := bob.c.Subscribe("alice"); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("alice", presence.Online)
	return sys, alice, bob
}

// events reads a client's events and remembers them.
type events struct {
	t    *testing.T
	c    *client.Client
	name string
	seen []client.Event
}

// await reads events until match returns true for one, and returns it. It
// fails the test when the events end or after waitFor.
func (e *events) await(what string, match func(client.Event) bool) client.Event {
	e.t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	from := len(e.seen)
	for {
		select {
		case ev, ok := <-e.c.Events():
			if !ok {
				e.t.Fatalf("%s: events ended waiting for %s: %v; seen %s", e.name, what, e.c.Err(), describe(e.seen[from:]))
			}
			e.seen = append(e.seen, ev)
			if match(ev) {
				return ev
			}
		case <-timer.C:
			e.t.Fatalf("%s: no %s after %v; seen %s", e.name, what, waitFor, describe(e.seen[from:]))
		}
	}
}

// awaitStatus waits for a Snapshot or Changes saying user has status.
func (e *events) awaitStatus(user string, status presence.Status) {
	e.t.Helper()
	e.await(fmt.Sprintf("%s %s", user, status), func(ev client.Event) bool {
		return says(ev, user, status)
	})
}

// drain takes the events waiting in the channel, without waiting.
func (e *events) drain() {
	for {
		select {
		case ev, ok := <-e.c.Events():
			if !ok {
				return
			}
			e.seen = append(e.seen, ev)
		default:
			return
		}
	}
}

// says reports whether ev is a Snapshot or Changes saying user has status.
func says(ev client.Event, user string, status presence.Status) bool {
	var list []presence.Presence
	switch ev := ev.(type) {
	case client.Snapshot:
		list = ev.Users
	case client.Changes:
		list = ev.Updates
	}
	for _, p := range list {
		if p.UserID == user && p.Status == status {
			return true
		}
	}
	return false
}

func describe(evs []client.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "%T%+v ", ev, ev)
	}
	return b.String()
}

func isType[T client.Event](ev client.Event) bool {
	_, ok := ev.(T)
	return ok
}

func TestConnectReceivesHello(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	alice := connect(t, sys.Gateway(), "alice", client.Config{Device: "desktop"})
	ev := alice.await("connected", isType[client.Connected]).(client.Connected)
	if ev.UserID != "alice" || ev.ConnID == "" || ev.HeartbeatIntervalMS != systest.Heartbeat.Milliseconds() || ev.TTLMS != systest.TTL.Milliseconds() {
		t.Fatalf("hello = %+v", ev.Hello)
	}
	if h := alice.c.Hello(); h != ev.Hello {
		t.Errorf("Hello() = %+v, want %+v", h, ev.Hello)
	}
	self := alice.await("self", isType[client.Self]).(client.Self)
	if self.Status != presence.Online || self.Devices != 1 {
		t.Errorf("self = %+v, want online on 1 device", self.Self)
	}
	if !alice.c.Connected() {
		t.Error("not connected")
	}
	if err := alice.c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := alice.c.Err(); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Err() = %v, want ErrClosed", err)
	}
	for range alice.c.Events() {
	}
	if err := alice.c.SetStatus(presence.Busy); !errors.Is(err, client.ErrClosed) {
		t.Errorf("SetStatus after Close = %v, want ErrClosed", err)
	}
}

// TestHeartbeatsKeepTheConnectionOnline lets a client live through five
// of the gateway's TTLs doing nothing: its own heartbeats must keep it
// connected and its user online.
func TestHeartbeatsKeepTheConnectionOnline(t *testing.T) {
	t.Parallel()
	sys, alice, bob := bobWatchesAlice(t, client.Config{})
	connID := alice.c.Hello().ConnID

	// Five TTLs' worth of heartbeats, at the interval the gateway asked.
	want := uint64(5*systest.TTL/systest.Heartbeat) + 1
	natstest.CheckFor(t, waitFor, 20*time.Millisecond, func() error {
		if n := alice.c.Stats().Heartbeats; n < want {
			return fmt.Errorf("%d heartbeats sent, want %d", n, want)
		}
		return nil
	})
	alice.drain()
	bob.drain()
	for _, ev := range alice.seen {
		if isType[client.Disconnected](ev) || isType[client.Reconnected](ev) {
			t.Fatalf("alice lost her connection: %s", describe(alice.seen))
		}
	}
	for _, ev := range bob.seen {
		if says(ev, "alice", presence.Offline) {
			t.Fatalf("bob saw alice offline: %s", describe(bob.seen))
		}
	}
	if got := alice.c.Hello().ConnID; got != connID || !alice.c.Connected() {
		t.Fatalf("connection %s, connected %v; want still %s", got, alice.c.Connected(), connID)
	}
	rec, err := sys.StatusOf("alice")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != presence.Online {
		t.Fatalf("alice's record says %s, want online", rec.Status)
	}
}

func TestSubscribeSeesAnotherUserConnect(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	sys.Mutual("alice", "bob")
	g := sys.Gateway()
	bob := connect(t, g, "bob", client.Config{})
	if err := bob.c.Subscribe("alice"); err != nil {
		t.Fatal(err)
	}
	snap := bob.await("snapshot", isType[client.Snapshot]).(client.Snapshot)
	if len(snap.Users) != 1 || snap.Users[0].UserID != "alice" || snap.Users[0].Status != presence.Offline || snap.ID == "" {
		t.Fatalf("snapshot = %+v, want alice offline, with an id", snap.PresenceInit)
	}
	connect(t, g, "alice", client.Config{})
	bob.awaitStatus("alice", presence.Online)
	if p, ok := bob.c.Presence("alice"); !ok || p.Status != presence.Online {
		t.Errorf("Presence(alice) = %+v, %v; want online", p, ok)
	}
	if got := bob.c.Watched(); len(got) != 1 || got[0] != "alice" {
		t.Errorf("Watched() = %v, want [alice]", got)
	}

	if err := bob.c.Unsubscribe("alice"); err != nil {
		t.Fatal(err)
	}
	if _, ok := bob.c.Presence("alice"); ok || len(bob.c.Watched()) != 0 {
		t.Errorf("alice still watched after Unsubscribe")
	}
}

func TestDeniedSubscriptionIsDropped(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	sys.Follow("bob", "carol") // not mutual
	bob := connect(t, sys.Gateway(), "bob", client.Config{})
	if err := bob.c.Subscribe("carol"); err != nil {
		t.Fatal(err)
	}
	d := bob.await("denied", isType[client.Denied]).(client.Denied)
	if d.UserID != "carol" || d.Reason != protocol.ReasonNotMutualFollowers {
		t.Fatalf("denied = %+v", d.Denied)
	}
	if w := bob.c.Watched(); len(w) != 0 {
		t.Errorf("Watched() = %v after a denial, want none", w)
	}
}

func TestSetStatusSeenByWatcher(t *testing.T) {
	t.Parallel()
	_, alice, bob := bobWatchesAlice(t, client.Config{})
	if err := alice.c.SetStatus(presence.Busy); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("alice", presence.Busy)
	alice.await("self busy", func(ev client.Event) bool {
		s, ok := ev.(client.Self)
		return ok && s.Status == presence.Busy
	})
	if got := alice.c.Status(); got != presence.Busy {
		t.Errorf("Status() = %q, want busy", got)
	}
	if err := alice.c.SetStatus("offline"); !errors.Is(err, presence.ErrInvalidStatus) {
		t.Errorf("SetStatus(offline) = %v, want ErrInvalidStatus", err)
	}
	if got := alice.c.Status(); got != presence.Busy {
		t.Errorf("a refused status changed Status() to %q", got)
	}
}

// TestSetCustomStatusSeenByWatcher: a custom status set with the Client
// reaches a watcher and comes back in Self; one the gateway would refuse
// is refused before it is sent; one set while no connection is open is
// sent on the next.
func TestSetCustomStatusSeenByWatcher(t *testing.T) {
	t.Parallel()
	sys, alice, bob := bobWatchesAlice(t, fast)
	lunch := &presence.Custom{Text: "Lunch", Emoji: "🥪", ExpiresAt: time.Now().Add(time.Hour).Unix()}
	if err := alice.c.SetCustomStatus(lunch); err != nil {
		t.Fatal(err)
	}
	bob.await("alice's custom status", func(ev client.Event) bool {
		ch, ok := ev.(client.Changes)
		return ok && len(ch.Updates) > 0 && ch.Updates[len(ch.Updates)-1].Custom.Equal(lunch)
	})
	alice.await("self with the custom status", func(ev client.Event) bool {
		s, ok := ev.(client.Self)
		return ok && s.Custom.Equal(lunch)
	})
	if err := alice.c.SetCustomStatus(&presence.Custom{Text: strings.Repeat("x", 101)}); !errors.Is(err, presence.ErrInvalidCustom) {
		t.Errorf("SetCustomStatus of 101 characters = %v, want ErrInvalidCustom", err)
	}

	// Set while the gateway is away: sent when the client is back.
	g := sys.Gateway()
	sys.StopGateway(g)
	alice.await("disconnected", isType[client.Disconnected])
	gym := &presence.Custom{Text: "Gym"}
	if err := alice.c.SetCustomStatus(gym); err != nil {
		t.Fatal(err)
	}
	sys.StartGatewayAt(gateway.Config{}, g.Addr)
	alice.await("self with the custom status set while away", func(ev client.Event) bool {
		s, ok := ev.(client.Self)
		return ok && s.Custom.Equal(gym)
	})
	if err := alice.c.SetCustomStatus(nil); err != nil {
		t.Fatal(err)
	}
	alice.await("self with no custom status", func(ev client.Event) bool {
		s, ok := ev.(client.Self)
		return ok && s.Custom == nil
	})
}

// TestReconnectAfterGatewayRestart stops the gateway under two clients and
// starts it again on the same address: both come back, alice's chosen
// status is sent again (it was changed meanwhile from another device, so
// only the re-send makes it busy again), bob's subscription is restored,
// and changes flow again.
func TestReconnectAfterGatewayRestart(t *testing.T) {
	t.Parallel()
	sys, alice, bob := bobWatchesAlice(t, fast)
	g := sys.Gateway()
	if err := alice.c.SetStatus(presence.Busy); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("alice", presence.Busy)

	sys.StopGateway(g)
	for _, e := range []*events{alice, bob} {
		d := e.await("disconnected", isType[client.Disconnected]).(client.Disconnected)
		var ce *client.CloseError
		if !errors.As(d.Err, &ce) || ce.Code != protocol.CloseGoingAway {
			t.Errorf("%s: disconnected by %v, want close 1001", e.name, d.Err)
		}
	}
	// While alice's client is away, her phone chooses online.
	other := sys.StartGateway(gateway.Config{})
	phone := sys.Dial(other, "alice", "phone")
	if err := phone.SetStatus(string(presence.Online)); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, phone, waitFor, "self online", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeSelf && m.Status == presence.Online
	})
	_ = phone.Close()

	sys.StartGatewayAt(gateway.Config{}, g.Addr)
	for _, e := range []*events{alice, bob} {
		r := e.await("reconnected", isType[client.Reconnected]).(client.Reconnected)
		if r.UserID != e.name || r.Attempts < 1 {
			t.Errorf("%s: reconnected = %+v", e.name, r)
		}
		if n := e.c.Stats().Reconnects; n != 1 {
			t.Errorf("%s: %d reconnects, want 1", e.name, n)
		}
	}
	bob.awaitStatus("alice", presence.Busy)
	if err := alice.c.SetStatus(presence.Away); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("alice", presence.Away)
}

// TestSubscribeAllForgetsWhoLeftWhileDisconnected: bob watches everyone
// and sees alice online; alice goes offline while bob's gateway is down,
// a change bob never hears of. The answer to his subscribe to all after
// the reconnect lists the users online, without her: Presence no longer
// says she is online.
func TestSubscribeAllForgetsWhoLeftWhileDisconnected(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	g := sys.Gateway()
	other := sys.StartGateway(gateway.Config{})
	alice := connect(t, other, "alice", fast)
	bob := connect(t, g, "bob", fast)
	if err := bob.c.SubscribeAll(); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("alice", presence.Online)

	sys.StopGateway(g)
	bob.await("disconnected", isType[client.Disconnected])
	if err := alice.c.Close(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, waitFor, 10*time.Millisecond, func() error {
		if rec, err := sys.StatusOf("alice"); err != nil || rec.Public != presence.Offline {
			return fmt.Errorf("alice is %+v (%v), want offline", rec, err)
		}
		return nil
	})
	sys.StartGatewayAt(gateway.Config{Policy: gateway.PolicyEveryone}, g.Addr)
	bob.await("reconnected", isType[client.Reconnected])
	bob.await("the snapshot of everyone", func(ev client.Event) bool {
		s, ok := ev.(client.Snapshot)
		return ok && s.OnlineCount != nil
	})
	if p, ok := bob.c.Presence("alice"); ok && p.Status != presence.Offline {
		t.Fatalf("Presence(alice) = %+v after she left, want offline or unknown", p)
	}
	// Bob himself is online: in the snapshot, or in a change soon after
	// it when the gateway's list had not heard of his connection yet.
	natstest.CheckFor(t, waitFor, 10*time.Millisecond, func() error {
		if p, ok := bob.c.Presence("bob"); !ok || p.Status != presence.Online {
			return fmt.Errorf("Presence(bob) = %+v, %v, want online", p, ok)
		}
		return nil
	})
}

// TestNoReconnectAfterUnauthorized: a 401 stops Connect at once, and stops
// a running client that meets it when reconnecting.
func TestNoReconnectAfterUnauthorized(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	g := sys.Gateway()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := client.Connect(ctx, g.WS, client.Config{Token: "not-a-token"})
	var he *client.HandshakeError
	if !errors.Is(err, client.ErrRefused) || !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
		t.Fatalf("connect with a token to a dev auth gateway: %v, want a 401 refusal", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Connect waited for its context instead of giving up")
	}

	alice := connect(t, g, "alice", fast)
	sys.StopGateway(g)
	alice.await("disconnected", isType[client.Disconnected])
	// The gateway comes back taking only tokens: ?user= is now a 401.
	sys.StartGatewayAt(gateway.Config{Tokens: noTokens{}}, g.Addr)
	select {
	case <-alice.c.Done():
	case <-time.After(waitFor):
		t.Fatal("the client still runs after a 401")
	}
	err = alice.c.Err()
	if !errors.Is(err, client.ErrRefused) || !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
		t.Fatalf("Err() = %v, want a 401 refusal", err)
	}
	for ev := range alice.c.Events() {
		if isType[client.Reconnected](ev) {
			t.Fatalf("reconnected despite the 401")
		}
	}
	if err := alice.c.Subscribe("bob"); !errors.Is(err, client.ErrRefused) {
		t.Errorf("Subscribe after the refusal = %v, want ErrRefused", err)
	}
	if err := alice.c.Close(); err != nil {
		t.Fatal(err)
	}
}

// noTokens refuses every token.
type noTokens struct{}

func (noTokens) Verify(string) (string, time.Time, error) {
	return "", time.Time{}, errors.New("no token is good")
}

func TestConnectWithToken(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Tokens: tokens{"t-carol": "carol"}}})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	calls := 0
	c, err := client.Connect(ctx, sys.Gateway().HTTP, client.Config{TokenFunc: func(context.Context) (string, error) {
		calls++
		return "t-carol", nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if h := c.Hello(); h.UserID != "carol" || calls != 1 {
		t.Fatalf("hello %+v after %d token calls, want carol after 1", h, calls)
	}
}

// tokens maps tokens to users, valid for an hour.
type tokens map[string]string

func (m tokens) Verify(tok string) (string, time.Time, error) {
	if u, ok := m[tok]; ok {
		return u, time.Now().Add(time.Hour), nil
	}
	return "", time.Time{}, errors.New("unknown token")
}

// TestSlowReaderLagsButLosesNothing lets events pile up unread: the
// overflow is counted and announced by a Lagged event, and Presence still
// has the newest state.
func TestSlowReaderLagsButLosesNothing(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	sys.Mutual("alice", "bob")
	g := sys.Gateway()
	alice := connect(t, g, "alice", client.Config{})
	cfg := client.Config{EventBuffer: 2}
	bob := connect(t, g, "bob", cfg)
	if err := bob.c.Subscribe("alice"); err != nil {
		t.Fatal(err)
	}
	// Bob reads nothing: hello and self fill his channel, and the snapshot
	// and the change that follow are dropped, yet recorded.
	for _, st := range []presence.Status{presence.Online, presence.Busy} {
		if st != presence.Online {
			if err := alice.c.SetStatus(st); err != nil {
				t.Fatal(err)
			}
		}
		natstest.CheckFor(t, waitFor, 5*time.Millisecond, func() error {
			if p, _ := bob.c.Presence("alice"); p.Status != st {
				return fmt.Errorf("bob has alice %q, want %s", p.Status, st)
			}
			return nil
		})
	}
	if n := bob.c.Stats().Dropped; n < 2 {
		t.Fatalf("%d events dropped, want at least 2", n)
	}
	bob.drain()
	if len(bob.seen) != 2 || !isType[client.Connected](bob.seen[0]) || !isType[client.Self](bob.seen[1]) {
		t.Fatalf("bob's channel held %s, want connected and self", describe(bob.seen))
	}
	if err := alice.c.SetStatus(presence.Invisible); err != nil {
		t.Fatal(err)
	}
	lag := bob.await("lagged", isType[client.Lagged]).(client.Lagged)
	if lag.Dropped != bob.c.Stats().Dropped {
		t.Fatalf("lagged = %+v", lag)
	}
	bob.awaitStatus("alice", presence.Offline)
	if p, _ := bob.c.Presence("alice"); p.Status != presence.Offline {
		t.Fatalf("Presence(alice) = %s, want offline", p.Status)
	}
}

// clientGoroutines returns the stacks of goroutines running code of
// package client.
func clientGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var found []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "greendot/pkg/client.") {
			found = append(found, g)
		}
	}
	return found
}

// TestCloseLeavesNoGoroutine closes a connected client and one waiting to
// reconnect: neither leaves a goroutine behind.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	sys.Mutual("alice", "bob")
	g := sys.Gateway()
	alice := connect(t, g, "alice", client.Config{})
	if err := alice.c.Subscribe("bob"); err != nil {
		t.Fatal(err)
	}
	alice.await("snapshot", isType[client.Snapshot])
	waiting := connect(t, g, "bob", client.Config{Backoff: client.Backoff{Base: time.Hour, Max: time.Hour}})
	other := sys.StartGateway(gateway.Config{})
	carol := connect(t, other, "carol", client.Config{})

	// Bob's client loses its gateway and waits up to an hour to retry.
	sys.StopGateway(g)
	alice.await("disconnected", isType[client.Disconnected])
	waiting.await("disconnected", isType[client.Disconnected])

	for _, e := range []*events{alice, waiting, carol} {
		start := time.Now()
		if err := e.c.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s: Close took %v", e.name, d)
		}
		if !errors.Is(e.c.Err(), client.ErrClosed) {
			t.Errorf("%s: Err() = %v, want ErrClosed", e.name, e.c.Err())
		}
	}
	natstest.CheckFor(t, waitFor, 10*time.Millisecond, func() error {
		if left := clientGoroutines(); len(left) > 0 {
			return fmt.Errorf("%d goroutines left:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		return nil
	})
}

// TestKeepActiveNeverAway runs the gateway with a short away-after: a
// client without KeepActive turns away, one with it stays online.
func TestKeepActiveNeverAway(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{AwayAfter: time.Second}})
	sys.Mutual("alice", "bob", "dave")
	g := sys.Gateway()
	bob := connect(t, g, "bob", client.Config{})
	alice := connect(t, g, "alice", client.Config{KeepActive: true})
	connect(t, g, "dave", client.Config{})
	if err := bob.c.Subscribe("alice", "dave"); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("dave", presence.Away)
	// Three away-afters' worth of activity.
	want := uint64(3*time.Second/systest.Heartbeat) + 1
	natstest.CheckFor(t, waitFor, 20*time.Millisecond, func() error {
		if n := alice.c.Stats().Heartbeats; n < want {
			return fmt.Errorf("%d activity messages sent, want %d", n, want)
		}
		return nil
	})
	bob.drain()
	for _, ev := range bob.seen {
		if says(ev, "alice", presence.Away) {
			t.Fatalf("alice turned away despite KeepActive: %s", describe(bob.seen))
		}
	}
	if p, _ := bob.c.Presence("alice"); p.Status != presence.Online {
		t.Fatalf("alice is %s, want online", p.Status)
	}
}

func TestIdleAndActivity(t *testing.T) {
	t.Parallel()
	_, alice, bob := bobWatchesAlice(t, client.Config{})
	if err := alice.c.Idle(); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("alice", presence.Away)
	if err := alice.c.Activity(); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("alice", presence.Online)
}

// TestActivityOnEveryInput calls Activity as an app does on every input
// event, far more often than the gateway takes messages: an activity goes
// at once, those that follow within a heartbeat interval go with the next
// heartbeat, so the client is not closed for going over the rate limit,
// and the person never turns away while the input goes on.
func TestActivityOnEveryInput(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{AwayAfter: time.Second}})
	sys.Mutual("alice", "bob")
	g := sys.Gateway()
	alice := connect(t, g, "alice", client.Config{})
	bob := connect(t, g, "bob", client.Config{})
	if err := bob.c.Subscribe("alice"); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("alice", presence.Away)
	for range 500 {
		if err := alice.c.Activity(); err != nil {
			t.Fatal(err)
		}
	}
	bob.awaitStatus("alice", presence.Online)
	back := len(bob.seen)
	// The person goes on using the device for three away-afters.
	input := time.NewTicker(20 * time.Millisecond)
	defer input.Stop()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); <-input.C {
		if err := alice.c.Activity(); err != nil {
			t.Fatal(err)
		}
	}
	if err := alice.c.SetStatus(presence.Busy); err != nil {
		t.Fatal(err)
	}
	alice.await("self busy", func(ev client.Event) bool {
		if d, ok := ev.(client.Disconnected); ok {
			t.Fatalf("disconnected by %v", d.Err)
		}
		s, ok := ev.(client.Self)
		return ok && s.Status == presence.Busy
	})
	bob.awaitStatus("alice", presence.Busy)
	for _, ev := range bob.seen[back:] {
		if says(ev, "alice", presence.Away) {
			t.Fatalf("alice turned away while active: %s", describe(bob.seen))
		}
	}
}

// expiring proves "short" for a second from when it is checked and
// "long" for an hour, both as carol.
type expiring struct{}

func (expiring) Verify(tok string) (string, time.Time, error) {
	switch tok {
	case "short":
		return "carol", time.Now().Add(time.Second), nil
	case "long":
		return "carol", time.Now().Add(time.Hour), nil
	}
	return "", time.Time{}, errors.New("unknown token")
}

// TestExpiredTokenRenewedOnlyWithTokenFunc: the gateway closes a socket
// whose token expired with 1008. A client with a TokenFunc comes back
// with a fresh token; one with a fixed token stops.
func TestExpiredTokenRenewedOnlyWithTokenFunc(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Tokens: expiring{}}})
	g := sys.Gateway()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	issued := make(chan string, 2)
	issued <- "short"
	issued <- "long"
	cfg := fast
	cfg.TokenFunc = func(ctx context.Context) (string, error) {
		select {
		case tok := <-issued:
			return tok, nil
		default:
			return "", errors.New("no more tokens")
		}
	}
	c, err := client.Connect(ctx, g.WS, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	renewing := &events{t: t, c: c, name: "renewing"}
	d := renewing.await("disconnected", isType[client.Disconnected]).(client.Disconnected)
	var ce *client.CloseError
	if !errors.As(d.Err, &ce) || ce.Code != protocol.ClosePolicy {
		t.Fatalf("disconnected by %v, want 1008", d.Err)
	}
	renewing.await("reconnected", isType[client.Reconnected])

	fixed, err := client.Connect(ctx, g.WS, client.Config{Token: "short"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fixed.Close() })
	select {
	case <-fixed.Done():
	case <-time.After(waitFor):
		t.Fatal("the client with an expired fixed token still runs")
	}
	if err := fixed.Err(); !errors.Is(err, client.ErrRefused) || !errors.As(err, &ce) || ce.Code != protocol.ClosePolicy {
		t.Fatalf("Err() = %v, want a 1008 refusal", err)
	}
}

// fakeGateway serves WebSockets that send hello and then leave the socket
// to serve, until the test ends; it returns their ws:// URL.
func fakeGateway(t *testing.T, hello string, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer nc.Close()
				if _, err := ws.Upgrade(nc); err != nil {
					return
				}
				if err := wsutil.WriteServerText(nc, []byte(hello)); err != nil {
					return
				}
				serve(nc)
			})
		}
	})
	return "ws://" + ln.Addr().String()
}

// TestSilentGatewayCountsAsGone serves WebSockets that send hello and then
// nothing, not even pongs: the client pings, gives up on the connection
// after the TTL, and connects again.
func TestSilentGatewayCountsAsGone(t *testing.T) {
	t.Parallel()
	pings := make(chan struct{}, 100)
	addr := fakeGateway(t, `{"type":"hello","user_id":"alice","conn_id":"c1","heartbeat_interval_ms":100,"ttl_ms":300,"status":"online"}`,
		func(nc net.Conn) {
			for {
				h, err := ws.ReadHeader(nc)
				if err != nil || h.OpCode == ws.OpClose {
					return
				}
				if _, err := io.CopyN(io.Discard, nc, h.Length); err != nil {
					return
				}
				if h.OpCode == ws.OpPing {
					select {
					case pings <- struct{}{}:
					default:
					}
				}
			}
		})
	cfg := fast
	e := connectURL(t, addr, "alice", cfg)
	d := e.await("disconnected", isType[client.Disconnected]).(client.Disconnected)
	var ne net.Error
	if !errors.As(d.Err, &ne) || !ne.Timeout() || !strings.Contains(d.Err.Error(), "silent") {
		t.Fatalf("disconnected by %v, want the gateway's silence", d.Err)
	}
	select {
	case <-pings:
	case <-time.After(waitFor):
		t.Fatal("the client sent no ping")
	}
	e.await("reconnected", isType[client.Reconnected])
	if err := e.c.Close(); err != nil {
		t.Fatal(err)
	}
}

// offer sends v on ch unless ch is full.
func offer[T any](ch chan<- T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// TestWritesLongAfterTheLastOne: a ping that comes (from the gateway, or a
// proxy on the way) longer than the write timeout after the client last
// wrote is answered with a pong, and the connection stays; a Close that
// long after the last write still sends a close frame with 1000.
func TestWritesLongAfterTheLastOne(t *testing.T) {
	t.Parallel()
	const writeTimeout = 50 * time.Millisecond
	pongs := make(chan struct{}, 1)
	quiet := make(chan struct{}, 1)
	closes := make(chan ws.StatusCode, 1)
	addr := fakeGateway(t, `{"type":"hello","user_id":"alice","conn_id":"c1","heartbeat_interval_ms":5000,"ttl_ms":60000,"status":"online"}`,
		func(nc net.Conn) {
			type frame struct {
				h       ws.Header
				payload []byte
			}
			frames := make(chan frame)
			go func() {
				defer close(frames)
				for {
					h, err := ws.ReadHeader(nc)
					if err != nil {
						return
					}
					payload := make([]byte, h.Length)
					if _, err := io.ReadFull(nc, payload); err != nil {
						return
					}
					ws.Cipher(payload, h.Mask, 0)
					frames <- frame{h, payload}
				}
			}()
			// Each step waits well past the deadline of the client's
			// last write.
			var ping, still <-chan time.Time
			for {
				select {
				case f, ok := <-frames:
					switch {
					case !ok:
						offer(closes, 0) // no close frame
						return
					case f.h.OpCode == ws.OpText && ping == nil:
						ping = time.After(10 * writeTimeout)
					case f.h.OpCode == ws.OpPong:
						offer(pongs, struct{}{})
						still = time.After(10 * writeTimeout)
					case f.h.OpCode == ws.OpClose:
						code, _ := ws.ParseCloseFrameData(f.payload)
						offer(closes, code)
						return
					}
				case <-ping:
					if err := ws.WriteFrame(nc, ws.NewPingFrame([]byte("x"))); err != nil {
						return
					}
				case <-still:
					offer(quiet, struct{}{})
				}
			}
		})
	cfg := fast
	cfg.WriteTimeout = writeTimeout
	c := connectURL(t, addr, "alice", cfg).c
	timeout := time.After(waitFor)
	for done := false; !done; {
		select {
		case <-pongs:
			done = true
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("no pong: the client stopped: %v", c.Err())
			}
			if d, ok := ev.(client.Disconnected); ok {
				t.Fatalf("no pong: disconnected by %v", d.Err)
			}
		case <-timeout:
			t.Fatal("no pong")
		}
	}
	select {
	case <-quiet:
	case <-timeout:
		t.Fatal("the gateway did not go on")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-closes:
		if code != ws.StatusNormalClosure {
			t.Fatalf("closed with %d (0: no close frame), want 1000", code)
		}
	case <-timeout:
		t.Fatal("no close frame")
	}
}

// TestManySubscriptionsArePaced subscribes to more users than the gateway
// takes at once, in more messages than its rate limit lets through in a
// burst: every one is answered, none refused.
func TestManySubscriptionsArePaced(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone, MaxSubscriptions: 10000}})
	bob := connect(t, sys.Gateway(), "bob", client.Config{})
	ids := make([]string, 6000)
	for i := range ids {
		ids[i] = fmt.Sprintf("user-%d", i)
	}
	if err := bob.c.Subscribe(ids...); err != nil {
		t.Fatal(err)
	}
	answered := make(map[string]bool)
	bob.await("every user answered", func(ev client.Event) bool {
		switch ev := ev.(type) {
		case client.Snapshot:
			for _, p := range ev.Users {
				answered[p.UserID] = true
			}
		case client.ServerError, client.Denied:
			t.Fatalf("a subscribe was refused: %+v", ev)
		}
		return len(answered) == len(ids)
	})
	if n := len(bob.c.Watched()); n != len(ids) {
		t.Fatalf("%d users watched, want %d", n, len(ids))
	}

	// Unsubscribes have no answer to wait for: only the rate, and a
	// short settle for a burst of them, paces them. The subscribe after
	// them is answered once they are all handled.
	if err := bob.c.Unsubscribe(ids...); err != nil {
		t.Fatal(err)
	}
	if err := bob.c.Subscribe("alice"); err != nil {
		t.Fatal(err)
	}
	bob.await("the subscribe after the unsubscribes", func(ev client.Event) bool {
		switch ev := ev.(type) {
		case client.ServerError, client.Denied, client.Disconnected:
			t.Fatalf("refused: %+v", ev)
		case client.Snapshot:
			return len(ev.Users) == 1 && ev.Users[0].UserID == "alice"
		}
		return false
	})
	if w := bob.c.Watched(); len(w) != 1 {
		t.Fatalf("watched %d users, want alice only", len(w))
	}
}

// A status chosen on another device is adopted, so that a reconnect does
// not undo it; an away is not, since it may be automatic.
func TestStatusChosenOnAnotherDeviceIsAdopted(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	g := sys.Gateway()
	alice := connect(t, g, "alice", fast)
	if err := alice.c.SetStatus(presence.Busy); err != nil {
		t.Fatal(err)
	}
	alice.await("self busy", func(ev client.Event) bool {
		s, ok := ev.(client.Self)
		return ok && s.Status == presence.Busy
	})
	phone := sys.Dial(g, "alice", "phone")
	if err := phone.SetStatus(string(presence.Online)); err != nil {
		t.Fatal(err)
	}
	alice.await("self online", func(ev client.Event) bool {
		s, ok := ev.(client.Self)
		return ok && s.Status == presence.Online
	})
	if st := alice.c.Status(); st != presence.Online {
		t.Fatalf("status after the phone chose online = %q, want online adopted", st)
	}
	// An away is never adopted: the client cannot tell one chosen from
	// one the gateway decided because every device was idle.
	if err := phone.SetStatus(string(presence.Away)); err != nil {
		t.Fatal(err)
	}
	alice.await("self away", func(ev client.Event) bool {
		s, ok := ev.(client.Self)
		return ok && s.Status == presence.Away
	})
	if st := alice.c.Status(); st != presence.Online {
		t.Fatalf("status after an away = %q, want online kept", st)
	}
}

// stallingProxy forwards TCP connections to a gateway until pause, from
// which on the connections open then pass nothing more either way, and what
// their clients send is soon no longer read, as on a network path that
// stalls.
type stallingProxy struct{ *tcpproxy.Proxy }

func newStallingProxy(t *testing.T, target string) *stallingProxy {
	t.Helper()
	return &stallingProxy{tcpproxy.Start(t, target, nil)}
}

// pause stalls the connections open now.
func (p *stallingProxy) pause() {
	for _, l := range p.Links() {
		l.Hold()
	}
}

// TestWriteTimeoutEndsTheConnection: when the network path stalls, the
// write of a status change times out; the client gives up on the
// connection at once, rather than with the next heartbeat (a minute
// later here) or never if the path comes back first, and sends the
// status on a new one.
func TestWriteTimeoutEndsTheConnection(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{HeartbeatInterval: time.Minute, ConnTTL: 3 * time.Minute}})
	proxy := newStallingProxy(t, sys.Gateway().Addr)
	cfg := fast
	cfg.WriteTimeout = 200 * time.Millisecond
	alice := connectURL(t, "ws://"+proxy.Addr(), "alice", cfg)
	c := alice.c
	proxy.pause()
	// Status changes fill the socket's buffers until a write times out.
	for end, i := time.Now().Add(waitFor), 0; !slices.ContainsFunc(alice.seen, isType[client.Disconnected]); i++ {
		if time.Now().After(end) {
			t.Fatalf("no disconnect after writes stalled for %v", waitFor)
		}
		st := []presence.Status{presence.Online, presence.Busy}[i%2]
		if err := c.SetStatus(st); err != nil {
			t.Fatal(err)
		}
		alice.drain()
	}
	if !slices.ContainsFunc(alice.seen, isType[client.Reconnected]) {
		alice.await("reconnected", isType[client.Reconnected])
	}
	want := c.Status()
	natstest.CheckFor(t, waitFor, 10*time.Millisecond, func() error {
		if rec, err := sys.StatusOf("alice"); err != nil || rec.Public != want {
			return fmt.Errorf("alice is %q (%v), want %s", rec.Public, err, want)
		}
		return nil
	})
}

// TestUnsubscribeAllKeepsTheUsersWatchedOneByOne: bob watches alice one by
// one and everyone; UnsubscribeAll forgets carol, whom he watched only
// through everyone, and the gateway tells him no more of her, while alice
// stays watched. Self has bob's own state.
func TestUnsubscribeAllKeepsTheUsersWatchedOneByOne(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	g := sys.Gateway()
	alice := connect(t, g, "alice", fast)
	carol := connect(t, g, "carol", fast)
	bob := connect(t, g, "bob", fast)
	if err := bob.c.Subscribe("alice"); err != nil {
		t.Fatal(err)
	}
	if err := bob.c.SubscribeAll(); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("carol", presence.Online)
	natstest.CheckFor(t, waitFor, 10*time.Millisecond, func() error {
		if s := bob.c.Self(); s.Status != presence.Online || s.Devices != 1 {
			return fmt.Errorf("Self() = %+v, want online on 1 device", s)
		}
		if _, ok := bob.c.Presence("alice"); !ok {
			return errors.New("no presence of alice")
		}
		return nil
	})

	if err := bob.c.UnsubscribeAll(); err != nil {
		t.Fatal(err)
	}
	if p, ok := bob.c.Presence("carol"); ok {
		t.Errorf("Presence(carol) = %+v after UnsubscribeAll, want forgotten", p)
	}
	if _, ok := bob.c.Presence("alice"); !ok {
		t.Error("Presence(alice) forgotten by UnsubscribeAll; she is watched one by one")
	}
	// The gateway handles a socket's requests in order: once dave's
	// subscription is answered, so is the unsubscribe.
	if err := bob.c.Subscribe("dave"); err != nil {
		t.Fatal(err)
	}
	bob.await("dave's snapshot", func(ev client.Event) bool {
		s, ok := ev.(client.Snapshot)
		return ok && slices.ContainsFunc(s.Users, func(p presence.Presence) bool { return p.UserID == "dave" })
	})
	from := len(bob.seen)
	if err := carol.c.SetStatus(presence.Busy); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, waitFor, 10*time.Millisecond, func() error {
		if rec, err := sys.StatusOf("carol"); err != nil || rec.Status != presence.Busy {
			return fmt.Errorf("carol is %+v (%v), want busy", rec, err)
		}
		return nil
	})
	if err := alice.c.SetStatus(presence.Busy); err != nil {
		t.Fatal(err)
	}
	bob.awaitStatus("alice", presence.Busy)
	for _, ev := range bob.seen[from:] {
		if says(ev, "carol", presence.Busy) {
			t.Errorf("bob heard of carol after UnsubscribeAll: %s", describe([]client.Event{ev}))
		}
	}
	if p, ok := bob.c.Presence("carol"); ok {
		t.Errorf("Presence(carol) = %+v, want forgotten", p)
	}
}
