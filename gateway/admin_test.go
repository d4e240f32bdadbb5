package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"

	"github.com/greendot/greendot/internal/metricstest"

	"github.com/nats-io/nats.go/micro"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// awaitCloseFrame reads c until the gateway closes it, and returns the close
// frame's code and reason.
func awaitCloseFrame(t *testing.T, c *client.Conn) *client.CloseError {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(systest.EventTimeout))
	for range 1000 {
		_, raw, err := c.Read()
		if err == nil {
			continue
		}
		var ce *client.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("read: %v (%s), want a close frame", err, raw)
		}
		return ce
	}
	t.Fatal("no close frame after 1000 frames")
	return nil
}

func TestAdminKick(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw1 := sys.Gateway()
	gw2 := sys.StartGateway(gateway.Config{})
	sys.Mutual("alice", "bob")
	ctx := context.Background()

	bob := sys.Dial(gw1, "bob")
	defer systest.KeepAlive(bob, systest.Heartbeat)()
	aWeb := sys.Dial(gw1, "alice", "web")
	aIOS := sys.Dial(gw2, "alice", "ios")
	defer systest.KeepAlive(aWeb, systest.Heartbeat)()
	defer systest.KeepAlive(aIOS, systest.Heartbeat)()
	view := systest.NewView(t, bob)
	if err := bob.Subscribe("s", "alice"); err != nil {
		t.Fatal(err)
	}
	view.Await("alice", presence.Online)

	// A kick reaches every gateway, not one of a queue group.
	replies, err := adminclient.Kick(ctx, sys.NC, admin.KickRequest{UserID: "alice"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(replies) != 2 {
		t.Fatalf("kick replies = %+v, want one per gateway", replies)
	}
	byGW := map[string]admin.KickReply{}
	for _, r := range replies {
		byGW[r.Gateway] = r
	}
	for _, g := range []*systest.Gateway{gw1, gw2} {
		r := byGW[g.ID()]
		if len(r.Closed) != 1 || r.Code != admin.ClosePolicy || r.UserID != "alice" {
			t.Errorf("gateway %s replied %+v, want one connection closed with 1008", g.ID(), r)
		}
		if v, _ := metricstest.Value(g.Registry(), "greendot_gateway_kicks_total"); v != 1 {
			t.Errorf("gateway %s kicks_total = %v, want 1", g.ID(), v)
		}
	}
	if byGW[gw1.ID()].Closed[0] != aWeb.Hello.ConnID || byGW[gw2.ID()].Closed[0] != aIOS.Hello.ConnID {
		t.Errorf("closed %v, want alice's web on %s and ios on %s", replies, gw1.ID(), gw2.ID())
	}
	for _, c := range []*client.Conn{aWeb, aIOS} {
		ce := awaitCloseFrame(t, c)
		if ce.Code != 1008 || ce.Reason != admin.DefaultKickReason {
			t.Errorf("close = %d %q, want 1008 %q", ce.Code, ce.Reason, admin.DefaultKickReason)
		}
	}
	// Her watchers see her go offline after the grace, like any close.
	view.Await("alice", presence.Offline)

	// A kick of a user nobody holds closes nothing, and says so.
	replies, err = adminclient.Kick(ctx, sys.NC, admin.KickRequest{UserID: "nobody"}, 5*time.Second)
	if err != nil || len(replies) != 2 || len(replies[0].Closed)+len(replies[1].Closed) != 0 {
		t.Fatalf("kick of nobody = %+v, %v", replies, err)
	}
}

func TestAdminKickOneConnection(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	ctx := context.Background()
	web := sys.Dial(gw, "alice", "web")
	ios := sys.Dial(gw, "alice", "ios")
	defer systest.KeepAlive(web, systest.Heartbeat)()
	defer systest.KeepAlive(ios, systest.Heartbeat)()

	replies, err := adminclient.Kick(ctx, sys.NC, admin.KickRequest{
		UserID: "alice", ConnID: web.Hello.ConnID, Code: admin.CloseNormal, Reason: "log in again",
	}, 5*time.Second)
	if err != nil || len(replies) != 1 || !slices.Equal(replies[0].Closed, []string{web.Hello.ConnID}) {
		t.Fatalf("kick = %+v, %v, want only the web connection", replies, err)
	}
	if ce := awaitCloseFrame(t, web); ce.Code != 1000 || ce.Reason != "log in again" {
		t.Errorf("close = %d %q, want 1000 %q", ce.Code, ce.Reason, "log in again")
	}
	// The other device stays connected and served. A View keeps the self
	// frame that says one device, whether it comes before or after the
	// presence_init.
	view := systest.NewView(t, ios)
	if err := ios.Subscribe("s1", "alice"); err != nil {
		t.Fatal(err)
	}
	view.Until(systest.EventTimeout, "presence_init s1", func(v *systest.View) bool {
		return slices.ContainsFunc(v.Frames, func(m protocol.ServerMessage) bool {
			return m.Type == protocol.TypePresenceInit && m.ID == "s1"
		})
	})
	view.AwaitSelf(presence.Online, 1)

	// Bad requests are micro errors with code 400, from every gateway.
	for _, body := range []string{
		`{"user_id":"alice","code":4000}`,
		`{"user_id":"alice","reason":"` + string(make([]byte, 200)) + `"}`,
		`not a user`,
		``,
	} {
		msgs, err := adminclient.Gather(ctx, sys.NC, admin.GatewayKickSubject, []byte(body), adminclient.GatherOptions{Want: 1, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if code := msgs[0].Header.Get(micro.ErrorCodeHeader); code != admin.CodeBadRequest {
			t.Errorf("kick %q: error code %q, want 400", body, code)
		}
	}
	// They closed nothing.
	if err := ios.Subscribe("s2", "alice"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, ios, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "s2"
	})
}

func TestAdminConnsAndWatchers(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw1 := sys.Gateway()
	gw2 := sys.StartGateway(gateway.Config{})
	sys.Mutual("alice", "bob", "carol")
	ctx := context.Background()

	web := sys.Dial(gw1, "alice", "web")
	ios := sys.Dial(gw2, "alice", "ios")
	defer systest.KeepAlive(web, systest.Heartbeat)()
	defer systest.KeepAlive(ios, systest.Heartbeat)()
	bob := sys.Dial(gw1, "bob", "desktop")
	carol := sys.Dial(gw2, "carol", "android")
	defer systest.KeepAlive(bob, systest.Heartbeat)()
	defer systest.KeepAlive(carol, systest.Heartbeat)()
	for _, c := range []*client.Conn{bob, carol} {
		if err := c.Subscribe("s", "alice"); err != nil {
			t.Fatal(err)
		}
		systest.AwaitStatus(t, c, "alice", presence.Online)
	}

	// conns: one gateway answers from the buckets, for every gateway.
	var r admin.ConnsReply
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		var err error
		if r, err = adminclient.Conns(ctx, sys.NC, "alice"); err != nil {
			return err
		}
		if r.Devices != 2 || len(r.Conns) != 2 {
			return fmt.Errorf("conns = %+v, want 2 devices", r)
		}
		return nil
	})
	if r.Status != presence.Online || r.Public != presence.Online || r.Since == nil || r.Revision == 0 {
		t.Errorf("conns = %+v", r)
	}
	want := map[string]struct{ gw, device string }{
		web.Hello.ConnID: {gw1.ID(), "web"},
		ios.Hello.ConnID: {gw2.ID(), "ios"},
	}
	for _, c := range r.Conns {
		w, ok := want[c.ConnID]
		if !ok || c.Gateway != w.gw || c.Device != w.device || !c.InRecord || !c.KeyLive || c.Idle || c.Closing ||
			c.Since.IsZero() || c.Lease == "" {
			t.Errorf("connection %+v, want %+v, live in record and key", c, w)
		}
	}

	// An idle device shows as idle; alice stays online thanks to the other.
	if err := web.Send(protocol.ClientMessage{Type: protocol.TypeIdle}); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		r, err := adminclient.Conns(ctx, sys.NC, "alice")
		if err != nil {
			return err
		}
		for _, c := range r.Conns {
			if c.ConnID == web.Hello.ConnID && c.Idle && r.Status == presence.Online {
				return nil
			}
		}
		return fmt.Errorf("web not idle yet: %+v", r)
	})

	// A user with no record is offline with no connections.
	r, err := adminclient.Conns(ctx, sys.NC, "nobody")
	if err != nil || r.Status != presence.Offline || len(r.Conns) != 0 || r.Revision != 0 {
		t.Errorf("conns of nobody = %+v, %v", r, err)
	}
	if _, err := adminclient.Conns(ctx, sys.NC, "bad id"); !errors.Is(err, admin.ErrBadRequest) {
		t.Errorf("conns of a bad id: %v, want ErrBadRequest", err)
	}

	// watchers: every gateway reports its sockets watching alice.
	ws, err := adminclient.Watchers(ctx, sys.NC, "alice", 5*time.Second)
	if err != nil || len(ws) != 2 {
		t.Fatalf("watchers = %+v, %v", ws, err)
	}
	got := map[string]string{}
	for _, rep := range ws {
		if !rep.Subscribed {
			t.Errorf("gateway %s not subscribed to alice: %+v", rep.Gateway, rep)
		}
		for _, w := range rep.Watchers {
			got[w.UserID] = rep.Gateway + "/" + w.Device + "/" + w.ConnID
		}
	}
	wantW := map[string]string{
		"bob":   gw1.ID() + "/desktop/" + bob.Hello.ConnID,
		"carol": gw2.ID() + "/android/" + carol.Hello.ConnID,
	}
	if fmt.Sprint(got) != fmt.Sprint(wantW) {
		t.Errorf("watchers = %v, want %v", got, wantW)
	}

	// When carol stops watching, gw2 drops its subscription.
	if err := carol.Send(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, UserIDs: []string{"alice"}}); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		ws, err := adminclient.Watchers(ctx, sys.NC, "alice", 5*time.Second)
		if err != nil {
			return err
		}
		for _, rep := range ws {
			if rep.Gateway == gw2.ID() && (rep.Subscribed || len(rep.Watchers) != 0) {
				return fmt.Errorf("gw2 still watches alice: %+v", rep)
			}
		}
		return nil
	})

	// info: every gateway's configuration and load.
	infos, err := adminclient.Broadcast[admin.Info](ctx, sys.NC, admin.GatewayService, admin.GatewayInfoSubject, nil, 5*time.Second)
	if err != nil || len(infos) != 2 {
		t.Fatalf("infos = %+v, %v", infos, err)
	}
	for _, in := range infos {
		if in.Service != admin.GatewayService || !in.Ready || in.Load["connections"] != float64(2) ||
			in.Config["conn_ttl"] != systest.TTL.String() || in.Config["addr"] == nil {
			t.Errorf("info = %+v", in)
		}
	}

	// micro metadata carries the gateway id, so `nats micro info` tells
	// instances apart.
	msgs, err := adminclient.Gather(ctx, sys.NC, adminclient.InfoSubject(admin.GatewayService), nil, adminclient.GatherOptions{Want: 2, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, m := range msgs {
		var mi micro.Info
		if err := json.Unmarshal(m.Data, &mi); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, mi.Metadata["id"])
	}
	slices.Sort(ids)
	wantIDs := []string{gw1.ID(), gw2.ID()}
	slices.Sort(wantIDs)
	if !slices.Equal(ids, wantIDs) {
		t.Errorf("micro metadata ids = %v, want %v", ids, wantIDs)
	}
}

func TestAdminWatchersOfEveryone(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.Gateway()
	ctx := context.Background()
	dave := sys.Dial(gw, "dave", "web")
	defer systest.KeepAlive(dave, systest.Heartbeat)()
	watchEveryone(t, dave)
	ws, err := adminclient.Watchers(ctx, sys.NC, "alice", 5*time.Second)
	if err != nil || len(ws) != 1 {
		t.Fatalf("watchers = %+v, %v", ws, err)
	}
	if w := ws[0].Watchers; len(w) != 1 || w[0].UserID != "dave" || !w[0].All {
		t.Fatalf("watchers = %+v, want dave watching everyone", ws[0])
	}
	// The gateway's one subscription to every user's events carries
	// alice's.
	if !ws[0].Subscribed {
		t.Errorf("watchers = %+v, want subscribed: the gateway receives every user's events", ws[0])
	}
}

func TestAdminMetrics(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	c := sys.Dial(gw, "alice")
	defer systest.KeepAlive(c, systest.Heartbeat)()
	// The gateway refreshes its lease about every second (every quarter
	// of a 1s TTL here).
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_lease_refreshes_total"); v < 2 {
			return fmt.Errorf("lease refreshes = %v, want at least 2", v)
		}
		return nil
	})
	names := metricstest.Names(gw.Registry())
	for _, n := range []string{
		"greendot_gateway_status_conflicts_total", "greendot_gateway_feed_late_writes_total", "greendot_gateway_kicks_total",
		"greendot_gateway_write_errors_total", "greendot_gateway_slow_socket_closes_total",
		"greendot_gateway_events_published_total", "greendot_gateway_leases_lost_total",
		"greendot_gateway_connections_reregistered_total", "greendot_gateway_lease_age_seconds",
		"greendot_gateway_closing_connections",
	} {
		if !slices.Contains(names, n) {
			t.Errorf("registry lacks %s", n)
		}
	}
}
