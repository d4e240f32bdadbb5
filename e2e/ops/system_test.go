package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"

	"github.com/greendot/greendot/internal/metricstest"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/testlog"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/system/systest"
	"github.com/greendot/greendot/webhook"
)

// scene is a running greendot in the state the operations page talks
// about: alice online on two devices (web on the first gateway, ios on the
// second), bob watching her from the first gateway, carol whose gateway
// stopped under her (so the reaper has a transition to report).
type scene struct {
	t   *testing.T
	sys *systest.System
	srv *server.Server
	nc  *nats.Conn // the operator's connection
	gw1 *systest.Gateway
	gw2 *systest.Gateway

	reaper *reaper.Service
	fanout *fanout.Service
	// hosts maps the addresses the page uses to the test's real ones.
	hosts map[string]string

	aliceWeb, aliceIOS, bob *client.Conn
	bobView                 *systest.View
	stops                   []func()
}

// startScene runs the system and brings it into the page's state.
func startScene(t *testing.T) *scene {
	t.Helper()
	srv := natstest.RunServerWithOptions(t, &server.Options{HTTPHost: "127.0.0.1", HTTPPort: -1})
	// The page's recipes wait for no expiry: a TTL of 5 s, where the
	// tests' 1 s lease could run out while a loaded machine pauses, and
	// take bob's registration with it.
	sys := systest.Start(t, systest.Options{Server: srv, NoReaper: true, NoFanout: true, Gateway: gateway.Config{ConnTTL: 5 * time.Second}})
	sc := &scene{t: t, sys: sys, srv: srv, nc: sys.NC, gw1: sys.Gateway()}
	sc.gw2 = sys.StartGateway(gateway.Config{})

	sc.reaper = runService(t, srv, "ops reaper", func(nc *nats.Conn) (svc, error) {
		return reaper.New(nc, reaper.Config{Logger: testlog.New(t), SweepInterval: time.Minute})
	}).(*reaper.Service)
	sc.fanout = runService(t, srv, "ops fanout", func(nc *nats.Conn) (svc, error) {
		return fanout.New(nc, fanout.Config{Logger: testlog.New(t)})
	}).(*fanout.Service)
	// The app's backend, which hears every transition.
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(backend.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := presence.EnsureFeed(ctx, sys.Store.JetStream(), presence.BucketOptions{}, 0); err != nil {
		t.Fatal(err)
	}
	runService(t, srv, "ops webhooks", func(nc *nats.Conn) (svc, error) {
		return webhook.New(nc, webhook.Config{Logger: testlog.New(t), URL: backend.URL, Secret: []byte("ops-page-secret-0123")})
	})
	sc.hosts = map[string]string{
		"127.0.0.1:8080": sc.gw1.Addr,
		"127.0.0.1:8222": srv.MonitorAddr().String(),
		"127.0.0.1:9101": serveOps(t, sc.reaper.Registry(), sc.reaper.Ready),
		"127.0.0.1:9102": serveOps(t, sc.fanout.Registry(), sc.fanout.Ready),
	}
	t.Cleanup(func() {
		for _, stop := range slices.Backward(sc.stops) {
			stop()
		}
	})

	sys.Mutual("alice", "bob", "carol")
	// carol's gateway stops while she is connected: once its lease ends,
	// the reaper turns her offline.
	gw3 := sys.StartGateway(gateway.Config{})
	carol := sys.Dial(gw3, "carol", "web")
	sys.StopGateway(gw3)
	_ = carol.Close()
	sc.bob = sys.Dial(sc.gw1, "bob", "web")
	sc.stops = append(sc.stops, systest.KeepAlive(sc.bob, systest.Heartbeat))
	sc.bobView = systest.NewView(t, sc.bob)
	if err := sc.bob.Subscribe("watch", "alice", "carol"); err != nil {
		t.Fatal(err)
	}
	sc.connectAlice()
	sc.bobView.Await("carol", presence.Offline)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if v, _ := metricstest.Value(sc.reaper.Registry(), "greendot_reaper_transitions_total", "status", "offline"); v < 1 {
			return errors.New("the reaper has not turned carol offline yet")
		}
		return nil
	})
	return sc
}

// connectAlice (re)connects alice's two devices and waits until bob sees
// her online and the record counts both.
func (sc *scene) connectAlice() {
	sc.t.Helper()
	sc.aliceWeb = sc.sys.Dial(sc.gw1, "alice", "web")
	sc.aliceIOS = sc.sys.Dial(sc.gw2, "alice", "ios")
	sc.stops = append(sc.stops,
		systest.KeepAlive(sc.aliceWeb, systest.Heartbeat),
		systest.KeepAlive(sc.aliceIOS, systest.Heartbeat))
	sc.bobView.Await("alice", presence.Online)
	natstest.CheckFor(sc.t, 10*time.Second, 20*time.Millisecond, func() error {
		rec, err := sc.sys.StatusOf("alice")
		if err != nil {
			return err
		}
		for _, id := range []string{sc.aliceWeb.Hello.ConnID, sc.aliceIOS.Hello.ConnID} {
			if c, ok := rec.Conns[id]; !ok || c.Closing {
				return fmt.Errorf("alice's record lacks %s: %+v", id, rec.Conns)
			}
		}
		return nil
	})
}

// sceneRoom is the room the page's room recipes look at.
const sceneRoom = "doc:42"

// joinRoom has a new connection of erin join sceneRoom (presence_rooms,
// presence.room.doc=42), and waits for its key.
func (sc *scene) joinRoom() {
	sc.t.Helper()
	erin := sc.sys.Dial(sc.gw1, "erin", "web")
	sc.stops = append(sc.stops, systest.KeepAlive(erin, systest.Heartbeat))
	if err := erin.Send(protocol.ClientMessage{Type: protocol.TypeJoin, Room: sceneRoom, Meta: json.RawMessage(`{"name":"Erin"}`)}); err != nil {
		sc.t.Fatal(err)
	}
	natstest.CheckFor(sc.t, 10*time.Second, 20*time.Millisecond, func() error {
		entries, err := sc.sys.Store.RoomMembers(context.Background(), sceneRoom)
		for _, e := range entries {
			if e.Member.ConnID == erin.Hello.ConnID {
				return nil
			}
		}
		return fmt.Errorf("erin's key in %s: not yet (%v)", sceneRoom, err)
	})
}

// stimulate makes changes every watcher of the page's commands can see:
// alice goes busy and back (presence_status, presence.event.alice), and
// dave connects (presence_conns).
func (sc *scene) stimulate() {
	sc.t.Helper()
	for _, st := range []string{"busy", "online"} {
		if err := sc.aliceWeb.SetStatus(st); err != nil {
			sc.t.Fatal(err)
		}
		sc.bobView.Await("alice", presence.Status(st))
	}
	dave := sc.sys.Dial(sc.gw1, "dave")
	sc.stops = append(sc.stops, systest.KeepAlive(dave, systest.Heartbeat))
}

// cid returns the NATS client id of the gateway interested in alice's
// events, from the server's subscription list.
func (sc *scene) cid() string {
	sc.t.Helper()
	sz, err := sc.srv.Subsz(&server.SubszOptions{Subscriptions: true, Test: presence.EventSubject("alice")})
	if err != nil {
		sc.t.Fatal(err)
	}
	for _, sub := range sz.Subs {
		if sub.Subject == presence.EventSubject("alice") {
			return fmt.Sprint(sub.Cid)
		}
	}
	sc.t.Fatalf("no subscription on %s: %+v", presence.EventSubject("alice"), sz.Subs)
	return ""
}

// lease returns the lease alice's web connection is held under on the
// first gateway.
func (sc *scene) lease() string {
	sc.t.Helper()
	rec, err := sc.sys.StatusOf("alice")
	if err != nil {
		sc.t.Fatal(err)
	}
	c, ok := rec.Conns[sc.aliceWeb.Hello.ConnID]
	if !ok || c.Lease == "" {
		sc.t.Fatalf("alice's web connection is not in her record under a lease: %+v", rec.Conns)
	}
	return c.Lease
}

// instance returns the micro instance id of the first gateway.
func (sc *scene) instance() string {
	sc.t.Helper()
	infos, err := adminclient.Broadcast[admin.Info](context.Background(), sc.nc, admin.GatewayService, admin.GatewayInfoSubject, nil, 5*time.Second)
	if err != nil {
		sc.t.Fatal(err)
	}
	for _, in := range infos {
		if in.ID == sc.gw1.ID() {
			return in.Instance
		}
	}
	sc.t.Fatalf("no info from %s: %+v", sc.gw1.ID(), infos)
	return ""
}

// svc is a reaper or a fanout.
type svc interface {
	Run(context.Context) error
	Ready(context.Context) error
}

// runService runs a service on its own NATS connection until the test
// ends, and waits until it is ready.
func runService(t *testing.T, srv *server.Server, name string, mk func(*nats.Conn) (svc, error)) svc {
	t.Helper()
	s, err := mk(natstest.Connect(t, srv, nats.Name(name)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop", name)
		}
	})
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return s.Ready(context.Background()) })
	return s
}

// serveOps serves a process's health and metrics as --metrics-listen does,
// and returns the address.
func serveOps(t *testing.T, reg prometheus.Gatherer, ready func(context.Context) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: metrics.OpsHandler(reg, ready), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

// metricNames returns every metric name greendot's processes register.
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	nc := &nats.Conn{} // never used: New does no I/O
	g, err := gateway.New(nc, gateway.Config{DevAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := reaper.New(nc, reaper.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := fanout.New(nc, fanout.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := webhook.New(nc, webhook.Config{URL: "https://app.example/hooks", Secret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, reg := range []prometheus.Collector{g.Registry(), r.Registry(), f.Registry(), w.Registry()} {
		for _, n := range metricstest.Names(reg) {
			out[n] = true
		}
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
