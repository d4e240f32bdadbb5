package faulttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/internal/freeport"
	"github.com/greendot/greendot/internal/testlog"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/system"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/system/systest"
	"github.com/greendot/greendot/webhook"
)

// The roles of nats.conf and the passwords the tests give them.
var rolePasswords = map[string]string{
	"gateway":  "gateway-test-password",
	"reaper":   "reaper-test-password",
	"fanout":   "fanout-test-password",
	"webhooks": "webhooks-test-password",
	"operator": "operator-test-password",
	"sys":      "sys-test-password",
}

// confEnv returns the environment nats.conf and deploy/nats/single.conf
// read, for a node named name on loopback: clients on port, routes on
// clusterPort, routed to the nodes on routePorts (itself included, as every
// node of a cluster is given the same list), a random monitoring port,
// storing in dir.
func confEnv(name, dir string, port, clusterPort int, routePorts []int) map[string]string {
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats-route://route:route-test-password@127.0.0.1:%d", p)))
	}
	return map[string]string{
		"NATS_SERVER_NAME":       name,
		"NATS_LISTEN":            fmt.Sprintf("127.0.0.1:%d", port),
		"NATS_HTTP":              "127.0.0.1:-1",
		"NATS_CLUSTER_LISTEN":    fmt.Sprintf("127.0.0.1:%d", clusterPort),
		"NATS_ROUTES":            "[" + strings.Join(routes, ", ") + "]",
		"NATS_STORE_DIR":         dir,
		"NATS_ROUTE_PASSWORD":    "route-test-password",
		"NATS_GATEWAY_PASSWORD":  rolePasswords["gateway"],
		"NATS_REAPER_PASSWORD":   rolePasswords["reaper"],
		"NATS_FANOUT_PASSWORD":   rolePasswords["fanout"],
		"NATS_WEBHOOKS_PASSWORD": rolePasswords["webhooks"],
		"NATS_OPERATOR_PASSWORD": rolePasswords["operator"],
		"NATS_SYS_PASSWORD":      rolePasswords["sys"],
	}
}

// violations collects the permission violations a server logs. It is the
// slog handler of the servers' logs.
type violations struct {
	mu    sync.Mutex
	lines []string
}

var _ slog.Handler = (*violations)(nil)

// Enabled takes every level: nats-server logs violations as errors, and
// only what it writes reaches the handler.
func (v *violations) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps the line if it is a violation, and prints it in verbose
// runs.
func (v *violations) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "Violation") {
		v.mu.Lock()
		v.lines = append(v.lines, r.Message)
		v.mu.Unlock()
	}
	if testlog.Verbose {
		fmt.Println("[nats]", r.Message)
	}
	return nil
}

// WithAttrs and WithGroup drop the attributes: the message says it all.
func (v *violations) WithAttrs([]slog.Attr) slog.Handler { return v }
func (v *violations) WithGroup(string) slog.Handler      { return v }

// take returns the violations logged since the last call, and forgets
// them.
func (v *violations) take() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.lines
	v.lines = nil
	return out
}

// await waits until a violation containing every one of parts is logged,
// and forgets every logged violation that contains them.
func (v *violations) await(tb testing.TB, parts ...string) {
	tb.Helper()
	has := func(l string) bool {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				return false
			}
		}
		return true
	}
	waitFor(tb, 10*time.Second, "violation "+strings.Join(parts, " "), func() error {
		v.mu.Lock()
		defer v.mu.Unlock()
		kept := v.lines[:0]
		found := false
		for _, l := range v.lines {
			if has(l) {
				found = true
			} else {
				kept = append(kept, l)
			}
		}
		v.lines = kept
		if found {
			return nil
		}
		return fmt.Errorf("logged: %v", v.lines)
	})
}

// connectAs connects to the cluster as one of accounts.conf's users.
func connectAs(tb testing.TB, c *natsCluster, user string, extra ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := natsconn.Connect(natsconn.Options{
		URL: c.urls(), Name: "faulttest " + user,
		User: user, Password: rolePasswords[user],
		Logger: testLogger(tb, user), Extra: extra,
	})
	if err != nil {
		tb.Fatalf("connect as %s: %v", user, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// TestPermissions runs every greendot process with its own user of
// nats.conf, against a server loaded from that file, through everything the
// processes do (connections, statuses, subscriptions, expiry, the HTTP API,
// global presence, admin endpoints), and checks that the server logs no
// permission violation. Then it checks what each role must not do.
func TestPermissions(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 3)
	viol := cl.viol
	// The operator sets the buckets up; the processes only bind them.
	store := cl.openStore(3)
	op := connectAs(t, cl, "operator")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	tm := timings{ttl: time.Second, heartbeat: 300 * time.Millisecond, grace: time.Second, ackWait: 5 * time.Second, replicas: 3}
	// The operator creates the feed the webhooks read, and the bucket
	// they keep the users of their dead letters in, as `greendot buckets
	// --feed` does.
	waitFor(t, 60*time.Second, "create "+presence.FeedStream, func() error {
		short, done := context.WithTimeout(ctx, 10*time.Second)
		defer done()
		return presence.EnsureWebhooks(short, store.JetStream(), presence.BucketOptions{Replicas: tm.replicas}, 0)
	})
	url := cl.urlsAs
	startReaper(t, url("reaper"), "reaper", tm)
	startFanout(t, url("fanout"), "fanout", tm)
	hooks := systest.NewHookSink(t, hookSecret)
	startWebhooks(t, url("webhooks"), hooks.URL, tm)
	gw := startGateway(t, url("gateway"), "gwmutual", tm)
	everyone := startGatewayWith(t, url("gateway"), "gweveryone", tm, func(c *gateway.Config) { c.Policy = gateway.PolicyEveryone })
	// Under --policy app, asking the app on NATS, which answers as the
	// operator.
	app := serveAppAuthz(t, op, appSubject, [2]string{"erin", "bob"})
	appGW := startGatewayWith(t, url("gateway"), "gwapp", tm, func(c *gateway.Config) {
		c.Policy, c.AppSubject, c.AppSecret, c.AppTimeout = gateway.PolicyApp, appSubject, appSecret, 5*time.Second
	})

	mutual(t, store, []string{"alice"}, []string{"bob", "dave"})
	if err := store.SetSettings(ctx, "bob", presence.Settings{LastSeen: presence.Everyone}); err != nil {
		t.Fatal(err)
	}
	alice := dialClient(t, "alice", []string{gw.WS}, tm.heartbeat, false)
	alice.subscribe("bob", "dave")
	bob := dialClient(t, "bob", []string{gw.WS}, tm.heartbeat, false)
	carol := dialClient(t, "carol", []string{everyone.WS}, tm.heartbeat, false)
	carol.subscribeAll()
	dialClient(t, "dave", []string{everyone.WS}, tm.heartbeat, false)
	expectViews(t, 10*time.Second, "alice sees bob and dave online", []*liveClient{alice}, truth{"bob": presence.Online, "dave": presence.Online})

	erin := dialClient(t, "erin", []string{appGW.WS}, tm.heartbeat, false)
	erin.subscribe("bob")
	expectViews(t, 10*time.Second, "erin, allowed by the app, sees bob online", []*liveClient{erin}, truth{"bob": presence.Online})

	if err := bob.setStatus(presence.Busy, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	expectViews(t, 10*time.Second, "busy bob", []*liveClient{alice, carol, erin}, truth{"bob": presence.Busy})
	// More changes of bob than the status bucket keeps: the gateway looks
	// at presence_feed before a write would drop a revision not copied.
	for i := range presence.StatusHistory + 2 {
		st := []presence.Status{presence.Away, presence.Busy}[i%2]
		if err := bob.setStatus(st, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	expectViews(t, 10*time.Second, "busy bob again", []*liveClient{alice, carol, erin}, truth{"bob": presence.Busy})
	// The webhooks process tells the app's backend.
	hooks.Await(t, "bob", presence.Busy)
	// A batch the backend refuses for good is a dead letter: the process
	// then reads its users' records and sends their current state, which
	// is the only way bob's newest revision, refused, reaches the backend.
	_, rev, err := store.Status(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	hooks.AwaitRev(t, "bob", rev)
	hooks.Refuse("bob")
	if err := bob.setStatus(presence.Away, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, rev, err = store.Status(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	hooks.AwaitRev(t, "bob", rev)
	if err := bob.setStatus(presence.Busy, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	// The app invalidates its answers about bob through a gateway's HTTP
	// API: the gateway publishes it, every app gateway hears it and asks
	// the app again about erin's subscription.
	asked := app.questions()
	postInvalidate(t, appGW.HTTP, `{"target":"bob"}`)
	waitFor(t, 10*time.Second, "the app asked again after the invalidation", func() error {
		if n := app.questions(); n <= asked {
			return fmt.Errorf("%d questions, as before", n)
		}
		return nil
	})

	// The HTTP API reads statuses and the graph.
	for _, path := range []string{"/api/presence/users/bob?user=alice", "/api/presence/friends?user=alice"} {
		httpGet(t, gw.HTTP, path)
	}
	httpGet(t, everyone.HTTP, "/api/presence/online?user=carol")

	// Admin endpoints and micro discovery, as an operator calls them.
	if inst, err := adminclient.Instances(ctx, op, admin.GatewayService, 5*time.Second); err != nil || len(inst) != 3 {
		t.Errorf("gateway instances: %v, %v", inst, err)
	}
	for _, svc := range []string{admin.ReaperService, admin.FanoutService, admin.WebhooksService} {
		if inst, err := adminclient.Instances(ctx, op, svc, 5*time.Second); err != nil || len(inst) != 1 {
			t.Errorf("%s instances: %v, %v", svc, inst, err)
		}
	}
	if r, err := adminclient.Conns(ctx, op, "bob"); err != nil || r.Status != presence.Busy {
		t.Errorf("conns of bob: %+v, %v", r, err)
	}
	if _, err := adminclient.Watchers(ctx, op, "bob", 5*time.Second); err != nil {
		t.Errorf("watchers of bob: %v", err)
	}
	// A custom status that expires: the gateway writes its timer, and a
	// reaper clears it at the timer's end.
	bob.mu.Lock()
	bobConn := bob.conn
	bob.mu.Unlock()
	if err := bobConn.SetCustomStatus("Lunch", "🥪", time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	customIs := func(set bool) func() error {
		return func() error {
			rec, _, err := store.Status(ctx, "bob")
			switch {
			case err != nil:
				return err
			case (rec.Custom != nil) != set:
				return fmt.Errorf("custom status %+v", rec.Custom)
			}
			return nil
		}
	}
	waitFor(t, 10*time.Second, "bob's custom status written", customIs(true))
	waitFor(t, 15*time.Second, "bob's custom status cleared at its expiry", customIs(false))
	// frank's record, written StatusHistory times, holds a connection of
	// a gateway lease that does not exist: the sweep's write that ends it
	// is the reaper's look at presence_feed.
	for i := range presence.StatusHistory {
		if _, _, _, err := store.UpdateStatus(ctx, "frank", func(r *presence.Record) error {
			r.SetConn("f1", presence.ConnInfo{Gateway: "gwgone", Lease: "1", Since: 1})
			r.Chosen = []presence.Status{presence.Away, presence.Busy}[i%2]
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := adminclient.Sweep(ctx, op); err != nil {
		t.Errorf("sweep: %v", err)
	}
	waitFor(t, 15*time.Second, "frank offline after the sweep", func() error {
		rec, _, err := store.Status(ctx, "frank")
		if err == nil && rec.Status != presence.Offline {
			return fmt.Errorf("frank is %s", rec.Status)
		}
		return err
	})
	if replies, err := adminclient.Kick(ctx, op, admin.KickRequest{UserID: "dave"}, 5*time.Second); err != nil || len(replies) != 3 {
		t.Errorf("kick dave: %v, %v", replies, err)
	}

	// A clean close, and a silent death: the reaper turns both into
	// offline, the fanout tells the watchers.
	bob.close()
	expectViews(t, 15*time.Second, "bob offline after a clean close", []*liveClient{alice, carol}, truth{"bob": presence.Offline})
	expectViews(t, 15*time.Second, "dave offline after a kick", []*liveClient{alice}, truth{"dave": presence.Offline})
	carol.abort()
	waitFor(t, 15*time.Second, "carol offline after dying", func() error {
		rec, _, err := store.Status(ctx, "carol")
		if err == nil && rec.Status != presence.Offline {
			return fmt.Errorf("carol is %s", rec.Status)
		}
		if errors.Is(err, presence.ErrNotFound) {
			return nil
		}
		return err
	})
	if v := viol.take(); len(v) > 0 {
		t.Errorf("the processes' users were refused what they do:\n%s", strings.Join(v, "\n"))
	}

	t.Run("gateway cannot write the graph", func(t *testing.T) {
		nc := connectAs(t, cl, "gateway")
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, presence.GraphBucket)
		if err != nil {
			t.Fatalf("gateway cannot even read the graph: %v", err)
		}
		if _, err := kv.Get(ctx, presence.FollowKey("alice", "bob")); err != nil {
			t.Fatalf("gateway cannot read a follow edge: %v", err)
		}
		short, done := context.WithTimeout(ctx, 2*time.Second)
		defer done()
		if _, err := kv.Put(short, presence.FollowKey("mallory", "alice"), []byte("1")); err == nil {
			t.Error("gateway wrote a follow edge")
		}
		viol.await(t, "Publish Violation", presence.KeySubject(presence.GraphBucket, presence.FollowKey("mallory", "alice")))
		if err := kv.Delete(short, presence.FollowKey("alice", "bob")); err == nil {
			t.Error("gateway deleted a follow edge")
		}
		for _, api := range []string{"STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE"} {
			subj := "$JS.API." + api + "." + presence.StreamName(presence.GraphBucket)
			_ = nc.Publish(subj, []byte("{}"))
			viol.await(t, "Publish Violation", subj)
		}
		// The graph is as the operator wrote it.
		if ok, err := store.Follows(ctx, "alice", "bob"); err != nil || !ok {
			t.Errorf("alice follows bob: %v, %v", ok, err)
		}
		if ok, err := store.Follows(ctx, "mallory", "alice"); err != nil || ok {
			t.Errorf("mallory follows alice: %v, %v", ok, err)
		}
	})

	t.Run("only the reaper purges a stream, and only presence_conns", func(t *testing.T) {
		for _, tt := range []struct{ user, stream string }{
			{"gateway", presence.StreamName(presence.ConnsBucket)},
			{"fanout", presence.StreamName(presence.ConnsBucket)},
			{"reaper", presence.StreamName(presence.StatusBucket)},
			{"reaper", presence.StreamName(presence.LeasesBucket)},
		} {
			nc := connectAs(t, cl, tt.user)
			subj := "$JS.API.STREAM.PURGE." + tt.stream
			_ = nc.Publish(subj, []byte("{}"))
			viol.await(t, "user:"+tt.user, "Publish Violation", `"`+subj+`"`)
		}
	})

	t.Run("no role takes over another's durable consumer", func(t *testing.T) {
		js := store.JetStream()
		conns, status := presence.StreamName(presence.ConnsBucket), presence.StreamName(presence.StatusBucket)
		leases := presence.StreamName(presence.LeasesBucket)
		before := map[string]string{}
		for _, c := range [][2]string{{conns, presence.ReaperConsumer}, {leases, presence.ReaperConsumer}, {status, presence.FanoutConsumer}} {
			info, err := consumerInfo(ctx, js, c[0], c[1])
			if err != nil {
				t.Fatal(err)
			}
			before[c[0]] = info.Config.FilterSubject
		}
		// A consumer config that would make the worker miss everything.
		hijack := func(stream, name string) []byte {
			b, _ := json.Marshal(map[string]any{"stream_name": stream, "config": map[string]any{
				"name": name, "ack_policy": "explicit", "deliver_policy": "last_per_subject",
				"filter_subject": "$KV.nobody.>"}})
			return b
		}
		for _, tt := range []struct{ user, stream, consumer string }{
			{"gateway", conns, presence.ReaperConsumer},
			{"gateway", leases, presence.ReaperConsumer},
			{"gateway", status, presence.FanoutConsumer},
			{"reaper", status, presence.FanoutConsumer},
			{"fanout", leases, presence.ReaperConsumer},
		} {
			nc := connectAs(t, cl, tt.user)
			for _, subj := range []string{
				"$JS.API.CONSUMER.CREATE." + tt.stream,                                       // name in the body
				"$JS.API.CONSUMER.CREATE." + tt.stream + "." + tt.consumer,                   // name in the subject
				"$JS.API.CONSUMER.CREATE." + tt.stream + "." + tt.consumer + ".$KV.nobody.>", // and a filter
				"$JS.API.CONSUMER.DELETE." + tt.stream + "." + tt.consumer,
			} {
				_ = nc.Publish(subj, hijack(tt.stream, tt.consumer))
				viol.await(t, "user:"+tt.user, "Publish Violation", `"`+subj+`"`)
			}
		}
		for _, c := range [][2]string{{conns, presence.ReaperConsumer}, {leases, presence.ReaperConsumer}, {status, presence.FanoutConsumer}} {
			info, err := consumerInfo(ctx, js, c[0], c[1])
			if err != nil || info.Config.FilterSubject != before[c[0]] {
				t.Errorf("consumer %s on %s: %v, %v; want it as it was (filter %s)", c[1], c[0], info, err, before[c[0]])
			}
		}
	})

	t.Run("roles cannot read outside their subjects or account", func(t *testing.T) {
		for _, user := range []string{"gateway", "reaper", "fanout"} {
			nc := connectAs(t, cl, user)
			for _, subj := range []string{">", "$SYS.>", "presence.self.alice"} {
				if _, err := nc.SubscribeSync(subj); err != nil {
					t.Fatal(err)
				}
				_ = nc.Flush()
				viol.await(t, "Subscription Violation", user, subj)
			}
		}
	})

	t.Run("reaper and fanout cannot write connections", func(t *testing.T) {
		for _, user := range []string{"reaper", "fanout"} {
			nc := connectAs(t, cl, user)
			subj := presence.KeySubject(presence.ConnsBucket, presence.ConnKey("alice", "forged"))
			_ = nc.Publish(subj, []byte("{}"))
			viol.await(t, "Publish Violation", user, subj)
		}
		nc := connectAs(t, cl, "fanout")
		subj := presence.KeySubject(presence.StatusBucket, "alice")
		_ = nc.Publish(subj, []byte("{}"))
		viol.await(t, "Publish Violation", "fanout", subj)
	})

	t.Run("webhooks cannot write a bucket but their keys of dead letters, or touch a stream", func(t *testing.T) {
		nc := connectAs(t, cl, "webhooks")
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, presence.StatusBucket)
		if err != nil {
			t.Fatalf("webhooks cannot look the status bucket up: %v", err)
		}
		short, done := context.WithTimeout(ctx, 2*time.Second)
		defer done()
		if _, err := kv.Put(short, "bob", []byte(`{"status":"offline"}`)); err == nil {
			t.Error("webhooks wrote a status record")
		}
		viol.await(t, "user:webhooks", "Publish Violation", presence.KeySubject(presence.StatusBucket, "bob"))
		for _, subj := range []string{
			presence.KeySubject(presence.GraphBucket, presence.FollowKey("mallory", "bob")),
			presence.KeySubject(presence.ConnsBucket, presence.ConnKey("bob", "forged")),
			presence.KeySubject(presence.LeasesBucket, presence.LeaseKey("gw", "forged")),
			// Only its own consumer's keys of the users of dead letters.
			presence.KeySubject(presence.WebhookResyncBucket, presence.ResyncKey("another", "bob")),
			"$JS.API.STREAM.PURGE." + presence.StreamName(presence.WebhookResyncBucket),
			"presence.event.bob",
			presence.PublishedSubject, // a forged report would keep the fanout from publishing
			"$JS.API.STREAM.PURGE." + presence.FeedStream,
			"$JS.API.STREAM.DELETE." + presence.FeedStream,
			"$JS.API.STREAM.UPDATE." + presence.FeedStream,
			"$JS.API.STREAM.CREATE.mine",
			"$JS.API.CONSUMER.DELETE." + presence.FeedStream + "." + presence.WebhooksConsumer,
			"$JS.API.CONSUMER.CREATE." + presence.StreamName(presence.StatusBucket) + "." + presence.FanoutConsumer + ".>",
		} {
			_ = nc.Publish(subj, []byte("{}"))
			viol.await(t, "user:webhooks", "Publish Violation", `"`+subj+`"`)
		}
		for _, subj := range []string{">", "presence.event.*", greendotAuthzSubjects} {
			if _, err := nc.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			viol.await(t, "Subscription Violation", "webhooks", subj)
		}
	})

	t.Run("only app subjects under greendot.authz.app for the gateway", func(t *testing.T) {
		nc := connectAs(t, cl, "gateway")
		for _, subj := range []string{"app.authz", "greendot.authz.other"} {
			_ = nc.Publish(subj, []byte("{}"))
			viol.await(t, "user:gateway", "Publish Violation", `"`+subj+`"`)
		}
	})

	t.Run("system account answers nats server commands", func(t *testing.T) {
		nc := connectAs(t, cl, "sys")
		msg, err := nc.Request("$SYS.REQ.SERVER.PING", nil, 5*time.Second)
		if err != nil {
			t.Fatalf("server ping as sys: %v", err)
		}
		var resp struct {
			Server struct {
				Name string `json:"name"`
			} `json:"server"`
		}
		if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Server.Name == "" {
			t.Errorf("server ping: %s, %v", msg.Data, err)
		}
		// The monitoring port answers health checks.
		mon := cl.nodes[0].srv.MonitorAddr()
		if mon == nil {
			t.Fatal("nats.conf opens no monitoring port")
		}
		httpGet(t, "http://"+mon.String(), "/healthz")
	})
}

// appSubject is the subject the app policy asks on in these tests: under
// greendot.authz.app., as the gateway role requires.
const appSubject = "greendot.authz.app.decide"

// greendotAuthzSubjects matches every subject of the app policy.
const greendotAuthzSubjects = "greendot.authz.>"

// appSecret is the secret a gateway under the app policy shares with the
// app: it verifies the app's invalidations POSTed to it.
var appSecret = []byte("faulttest app secret: 0123456789abcdef")

// appAuthz is the app's side of the app policy on NATS: a micro service
// allowing the pairs it was given, and counting the questions.
type appAuthz struct {
	mu      sync.Mutex
	allowed map[[2]string]bool
	asked   int
}

func (a *appAuthz) questions() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.asked
}

// serveAppAuthz answers the questions of subject over nc, as
// docs/integration.md shows, until the test ends.
func serveAppAuthz(tb testing.TB, nc *nats.Conn, subject string, pairs ...[2]string) *appAuthz {
	tb.Helper()
	a := &appAuthz{allowed: map[[2]string]bool{}}
	for _, p := range pairs {
		a.allowed[p] = true
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:    "authz",
		Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{
			Subject: subject,
			Handler: micro.HandlerFunc(func(req micro.Request) {
				var q struct {
					Watcher string   `json:"watcher"`
					Targets []string `json:"targets"`
					List    bool     `json:"list"`
				}
				if err := json.Unmarshal(req.Data(), &q); err != nil {
					_ = req.Error("400", "bad question", nil)
					return
				}
				a.mu.Lock()
				a.asked++
				allow := []string{}
				for p, on := range a.allowed {
					if on && p[0] == q.Watcher && (q.List || slices.Contains(q.Targets, p[1])) {
						allow = append(allow, p[1])
					}
				}
				a.mu.Unlock()
				_ = req.RespondJSON(map[string][]string{"allow": allow})
			}),
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = svc.Stop() })
	return a
}

// postInvalidate POSTs an invalidation to a gateway's HTTP API, signed
// with appSecret as docs/integration.md says, and fails the test unless
// it is published.
func postInvalidate(tb testing.TB, base, body string) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPost, base+gateway.InvalidatePath, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set(signature.Header, signature.Sign(appSecret, time.Now(), []byte(body)))
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		tb.Fatalf("POST %s: %d %s", gateway.InvalidatePath, resp.StatusCode, data)
	}
}

// hookSecret signs the deliveries of the webhooks process under test.
var hookSecret = []byte("faulttest webhook secret 0123456789")

// startWebhooks runs a webhooks process in the test process, delivering
// to url, until the test ends, and waits until it is ready.
func startWebhooks(tb testing.TB, urls, url string, t timings) *system.Proc {
	tb.Helper()
	p, err := system.StartWebhooks(conn(tb, "webhooks", urls), webhook.Config{
		Logger:    testLogger(tb, "webhooks"),
		Buckets:   presence.BucketOptions{Replicas: t.replicas},
		URL:       url,
		Secret:    hookSecret,
		BatchWait: 10 * time.Millisecond,
		PinnedTTL: 3 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	stopAtEnd(tb, p)
	if err := p.AwaitReady(context.Background(), 60*time.Second); err != nil {
		tb.Fatal(err)
	}
	return p
}

// freePort returns a loopback TCP port that was free a moment ago, and
// that it has not returned before in this process. It is below the
// kernel's ephemeral range, where outgoing connections take their ports,
// so that a server restarted on it later finds it free again.
func freePort(tb testing.TB) int {
	tb.Helper()
	p, err := freeport.Port()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// startGatewayWith runs a gateway like startGateway, with cfg changed by
// edit.
func startGatewayWith(tb testing.TB, urls, id string, t timings, edit func(*gateway.Config)) *system.Gateway {
	tb.Helper()
	t.edit = edit
	return startGateway(tb, urls, id, t)
}

// httpGet fails the test unless GET base+path answers 200.
func httpGet(tb testing.TB, base, path string) {
	tb.Helper()
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get(base + path)
	if err != nil {
		tb.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		tb.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
	}
}
