package faulttest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system"
)

// TestNATSStalled stops an out-of-process NATS server (SIGSTOP) for twice
// the connection TTL while clients keep sending heartbeats and choose
// statuses. Reading a socket never waits on NATS, so no socket may be
// closed: the gateway keeps hearing the heartbeats. The statuses chosen
// meanwhile wait, in order; once NATS runs again (SIGCONT) they apply, and
// every user ends as the status it chose last. (The stall outlives the
// gateway's lease, so its users may be shown offline for a moment, until
// the gateway registers them again under a new lease.)
func TestNATSStalled(t *testing.T) {
	tooltest.Long(t)
	greendotBinary(t) // where nats-server is built
	bin, err := natsServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	nats, err := system.StartChild(system.ChildOptions{
		Name: "nats-server",
		Path: bin,
		Args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nats.Signal(syscall.SIGCONT)
		_ = nats.Kill()
	})
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	waitFor(t, 30*time.Second, "nats-server listening", func() error {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			_ = c.Close()
		}
		return err
	})
	nc, err := natsconn.Connect(natsconn.Options{URL: url, Name: "faulttest operator", Logger: testLogger(t, "operator")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx := context.Background()
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}

	tm := timings{ttl: 2 * time.Second, heartbeat: 300 * time.Millisecond, grace: time.Second, ackWait: 3 * time.Second, replicas: 1}
	startReaper(t, url, "reaper", tm)
	startFanout(t, url, "fanout", tm)
	gw := startGateway(t, url, "gw", tm)

	users, watcherIDs := names("u", 4), names("w", 1)
	mutual(t, store, watcherIDs, users)
	w := dialClient(t, watcherIDs[0], []string{gw.WS}, tm.heartbeat, false)
	clients := map[string]*liveClient{}
	want := truth{}
	for _, u := range users {
		clients[u] = dialClient(t, u, []string{gw.WS}, tm.heartbeat, false)
		want[u] = presence.Online
	}
	w.subscribe(users...)
	expectViews(t, 15*time.Second, "everyone online", []*liveClient{w}, want)

	// NATS stops; the clients go on heartbeating and choose statuses,
	// three each, the last one different per user.
	nats.Signal(syscall.SIGSTOP)
	stalled := time.Now()
	last := []presence.Status{presence.Busy, presence.Away, presence.Invisible, presence.Busy}
	for i, u := range users {
		for _, st := range []presence.Status{presence.Away, presence.Busy, last[i]} {
			if err := clients[u].current().SetStatus(string(st)); err != nil {
				t.Fatalf("%s: send set_status: %v", u, err)
			}
		}
		want[u] = last[i].Public()
	}
	waitFor(t, 4*tm.ttl, "the stall to last twice the TTL", func() error {
		if time.Since(stalled) < 2*tm.ttl {
			return fmt.Errorf("stalled for %v", time.Since(stalled))
		}
		return nil
	})
	nats.Signal(syscall.SIGCONT)
	t.Logf("nats stalled for %v", time.Since(stalled).Round(time.Millisecond))

	// Every user ends as it chose last, in the records and for the
	// watcher.
	waitFor(t, 30*time.Second, "the statuses chosen during the stall applied", func() error {
		for i, u := range users {
			rec, _, err := store.Status(ctx, u)
			if err != nil {
				return err
			}
			if rec.ChosenStatus() != last[i] || rec.Devices != 1 {
				return fmt.Errorf("record of %s: chosen %s with %d devices, want %s with 1", u, rec.ChosenStatus(), rec.Devices, last[i])
			}
		}
		return nil
	})
	expectViews(t, 15*time.Second, "everyone as they chose last", []*liveClient{w}, want)
	for _, c := range append([]*liveClient{w}, clientsOf(clients, users)...) {
		if ev := c.closeEvents(); len(ev) > 0 {
			t.Errorf("%s's socket was closed while NATS stalled: %+v", c.user, ev)
		}
	}
}

// clientsOf returns the clients of users, in order.
func clientsOf(clients map[string]*liveClient, users []string) []*liveClient {
	out := make([]*liveClient, len(users))
	for i, u := range users {
		out[i] = clients[u]
	}
	return out
}
