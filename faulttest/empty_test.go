package faulttest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/system"
)

// TestNATSBackEmpty: the NATS server comes back without its storage (a
// volume lost, a server rebuilt), and stays without buckets for longer
// than the lease TTL, until the operator creates them again (`greendot
// buckets`) and the app writes its graph again, as docs/deploy.md says.
// The revisions of the new buckets start again, so every greendot process
// holds revisions unrelated to theirs: each stops by itself with an error
// that says its buckets were replaced (the gateways closing their sockets
// with 1001, the child process exiting with a failure), writing nothing
// from what it held. Processes started after that (as a supervisor does)
// serve everyone as they are: watchers see every user who stayed
// connected online, a chosen status reaches them, the records agree, a
// vanished user goes offline, and so do the users of a gateway that dies,
// through the new reaper.
func TestNATSBackEmpty(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 1)
	store := cl.openStore(1)
	tm := timings{ttl: 3 * time.Second, heartbeat: 500 * time.Millisecond, grace: time.Second, ackWait: 3 * time.Second, replicas: 1}
	reaperProc, err := system.StartReaper(conn(t, "reaper", cl.urlsAs("reaper")), reaper.Config{
		Logger: testLogger(t, "reaper"), Buckets: presence.BucketOptions{Replicas: 1}, SweepInterval: 5 * time.Second, AckWait: tm.ackWait,
	})
	if err != nil {
		t.Fatal(err)
	}
	replacedAtEnd(t, reaperProc)
	fanoutProc, err := system.StartFanout(conn(t, "fanout", cl.urlsAs("fanout")), fanout.Config{
		Logger: testLogger(t, "fanout"), Buckets: presence.BucketOptions{Replicas: 1}, AckWait: tm.ackWait,
	})
	if err != nil {
		t.Fatal(err)
	}
	replacedAtEnd(t, fanoutProc)
	gwLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := system.StartGateway(conn(t, "gw", cl.urlsAs("gateway")), gatewayConfig(t, "gw", tm), gwLn)
	if err != nil {
		t.Fatal(err)
	}
	replacedAtEnd(t, gw.Proc)
	child, childWS := startChildGateway(t, cl, "gw2", tm)
	ctx := context.Background()
	for _, p := range []*system.Proc{reaperProc, fanoutProc, gw.Proc} {
		if err := p.AwaitReady(ctx, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// The gateway that follows gw listens from now on, so that gw's
	// clients can be told where to go when it closes them with 1001.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	urls := []string{gw.WS, "ws://" + ln.Addr().String() + gateway.WebSocketPath}

	users, watcherIDs := names("s", 3), names("w", 2)
	all := append([]string{"c1"}, users...)
	mutual(t, store, watcherIDs, all)
	var watchers []*liveClient
	for _, id := range watcherIDs {
		watchers = append(watchers, dialClient(t, id, urls, tm.heartbeat, true))
	}
	clients := map[string]*liveClient{}
	want := truth{}
	for _, u := range users {
		clients[u] = dialClient(t, u, urls, tm.heartbeat, true)
		want[u] = presence.Online
	}
	clients["c1"] = dialClient(t, "c1", []string{childWS}, tm.heartbeat, false)
	want["c1"] = presence.Online
	for _, w := range watchers {
		w.subscribe(all...)
	}
	expectViews(t, 15*time.Second, "everyone online", watchers, want)

	// NATS comes back empty, and stays without buckets for longer than
	// the lease TTL.
	cl.kill(0)
	if err := os.RemoveAll(cl.nodes[0].storeDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cl.nodes[0].storeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	cl.restart(0)
	time.Sleep(tm.ttl + time.Second) // how long the buckets are missing, not a wait for anything
	store = cl.openStore(1)
	mutual(t, store, append([]string{"w3"}, watcherIDs...), all)

	// Each process stops by itself; a new one starts in its place, as a
	// supervisor starts it again: first the gateway, whose clients move
	// to its successor.
	stopped := func(p *system.Proc) error {
		select {
		case <-p.Done():
		default:
			return fmt.Errorf("%s still runs", p.Name())
		}
		if err := p.Err(); !errors.Is(err, presence.ErrStoreReplaced) {
			return fmt.Errorf("%s stopped with %v, want %v", p.Name(), err, presence.ErrStoreReplaced)
		}
		return nil
	}
	waitFor(t, 60*time.Second, "the gateway stopped, saying its buckets were replaced", func() error { return stopped(gw.Proc) })
	newGW, err := system.StartGateway(conn(t, "gw3", cl.urlsAs("gateway")), gatewayConfig(t, "gw3", tm), ln)
	if err != nil {
		t.Fatal(err)
	}
	stopAtEnd(t, newGW.Proc)
	waitFor(t, 60*time.Second, "the reaper, the fanout and the child gateway stopped, saying their buckets were replaced", func() error {
		for _, p := range []*system.Proc{reaperProc, fanoutProc} {
			if err := stopped(p); err != nil {
				return err
			}
		}
		if exited, err := child.Exited(); !exited || err == nil {
			return fmt.Errorf("gw2: exited %v with %v, want a failure", exited, err)
		}
		if tail := child.Tail(); !strings.Contains(tail, presence.ErrStoreReplaced.Error()) {
			return fmt.Errorf("gw2 did not say why it stopped:\n%s", tail)
		}
		return nil
	})
	// c1's gateway closed it; it does not come back.
	clients["c1"].abort()
	want["c1"] = presence.Offline
	newReaper := startReaper(t, cl.urlsAs("reaper"), "reaper2", tm)
	startFanout(t, cl.urlsAs("fanout"), "fanout2", tm)
	for _, p := range []*system.Proc{newGW.Proc, newReaper} {
		if err := p.AwaitReady(ctx, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	expectViews(t, 30*time.Second, "everyone as they are on the new buckets", watchers, want)
	if err := clients["s1"].setStatus(presence.Busy, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	want["s1"] = presence.Busy
	expectViews(t, 15*time.Second, "s1 busy", watchers, want)

	doomed, doomedWS := startChildGateway(t, cl, "gw4", tm)
	clients["c1"] = dialClient(t, "c1", []string{doomedWS}, tm.heartbeat, false)
	want["c1"] = presence.Online
	late := dialClient(t, "w3", urls[1:], tm.heartbeat, false)
	late.subscribe(all...)
	watchers = append(watchers, late)
	expectViews(t, 15*time.Second, "c1 back, and a watcher who came after sees everyone as they are", watchers, want)
	waitFor(t, 15*time.Second, "records agree", func() error {
		for _, u := range all {
			rec, _, err := store.Status(ctx, u)
			if err != nil {
				return fmt.Errorf("%s: %w", u, err)
			}
			if rec.Public != want[u] || len(rec.Conns) != 1 {
				return fmt.Errorf("record of %s: %+v; want %s with 1 connection", u, rec, want[u])
			}
		}
		return nil
	})

	clients["s2"].abort()
	want["s2"] = presence.Offline
	expectViews(t, 15*time.Second, "s2 offline after it vanished", watchers, want)
	kill(t, doomed)
	want["c1"] = presence.Offline
	expectViews(t, 30*time.Second, "c1 offline after its gateway died", watchers, want)
	// The clients end before gw3 stops, or they would move back to gw.
	for _, c := range append(watchers, clients["s0"], clients["s1"]) {
		c.abort()
	}
}

// replacedAtEnd stops p when the test ends, as stopAtEnd does, and takes
// its having stopped because its buckets were replaced for a clean stop.
func replacedAtEnd(tb testing.TB, p *system.Proc) {
	tb.Cleanup(func() {
		if err := p.Stop(60 * time.Second); err != nil && !errors.Is(err, presence.ErrStoreReplaced) {
			tb.Errorf("%v", err)
		}
	})
}
