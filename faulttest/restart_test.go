package faulttest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/presence"
)

// backWithin is how soon after NATS is back the users who stayed connected
// must be shown as they are again, and those who left shown offline.
const backWithin = 5 * time.Second

// TestNATSRestarted runs greendot on a single NATS server with file
// storage (deploy/nats/single.conf) and takes NATS away twice.
//
// First the gateway's own NATS connection is dropped by the server: it
// reconnects at once, and nobody may be shown offline, since its lease
// never lapsed.
//
// Then the whole server stops, for longer than the gateway's lease TTL,
// and starts again with its storage. While it is down, some users leave
// (cleanly, or by vanishing). Within 5 s of NATS being back, every watcher
// must see the users who stayed connected as they are (chosen statuses
// survive: they are in the file store), and the users who left offline;
// the records must agree.
func TestNATSRestarted(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 1)
	store := cl.openStore(1)
	tm := timings{ttl: 3 * time.Second, heartbeat: 500 * time.Millisecond, grace: time.Second, ackWait: 3 * time.Second, replicas: 1}
	startReaper(t, cl.urlsAs("reaper"), "reaper", tm)
	startFanout(t, cl.urlsAs("fanout"), "fanout", tm)
	gw := startGateway(t, cl.urlsAs("gateway"), "gw", tm)

	steady, leavers, watcherIDs := names("s", 5), names("l", 4), names("w", 2)
	users := append(append([]string{}, steady...), leavers...)
	mutual(t, store, watcherIDs, users)
	var watchers []*liveClient
	for _, id := range watcherIDs {
		watchers = append(watchers, dialClient(t, id, []string{gw.WS}, tm.heartbeat, false))
	}
	clients := map[string]*liveClient{}
	want := truth{}
	for _, u := range users {
		clients[u] = dialClient(t, u, []string{gw.WS}, tm.heartbeat, false)
		want[u] = presence.Online
	}
	for _, w := range watchers {
		w.subscribe(users...)
	}
	expectViews(t, 15*time.Second, "everyone online", watchers, want)
	if err := clients["s1"].setStatus(presence.Busy, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	want["s1"] = presence.Busy
	expectViews(t, 15*time.Second, "s1 busy", watchers, want)
	watching := time.Now()

	// The gateway's connection drops and comes back.
	cid, err := gw.Conn().GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	reconnects := gw.Conn().Stats().Reconnects
	if err := cl.nodes[0].srv.DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "gateway reconnected", func() error {
		if gw.Conn().Stats().Reconnects == reconnects || !gw.Conn().IsConnected() {
			return errors.New("not yet")
		}
		return nil
	})
	if err := clients["s2"].setStatus(presence.Away, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	want["s2"] = presence.Away
	expectViews(t, 15*time.Second, "s2 away after the gateway reconnected", watchers, want)
	neverOffline(t, watchers, users, watching, time.Now())

	// The whole server goes away, longer than the lease TTL.
	cl.kill(0)
	downAt := time.Now()
	for i, u := range leavers {
		if i%2 == 0 {
			clients[u].close()
		} else {
			clients[u].abort()
		}
		want[u] = presence.Offline
	}
	outage := tm.ttl + 3*time.Second
	time.Sleep(time.Until(downAt.Add(outage)))
	cl.restart(0)
	backAt := time.Now()
	t.Logf("nats was down for %v", backAt.Sub(downAt).Round(time.Millisecond))
	expectViews(t, backWithin, fmt.Sprintf("everyone as they are within %v of NATS back", backWithin), watchers, want)
	t.Logf("every watcher saw the truth %v after NATS was back", time.Since(backAt).Round(time.Millisecond))

	// The state agrees, and stays so.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, 15*time.Second, "records agree", func() error {
		for _, u := range users {
			rec, _, err := store.Status(ctx, u)
			if err != nil {
				return fmt.Errorf("%s: %w", u, err)
			}
			conns := 1
			if want[u] == presence.Offline {
				conns = 0
			}
			if rec.Public != want[u] || len(rec.Conns) != conns {
				return fmt.Errorf("record of %s: %+v; want %s with %d connections", u, rec, want[u], conns)
			}
		}
		return nil
	})
	settled := time.Now()
	// What the watchers saw after NATS came back: the last change anyone
	// saw came within backWithin, and no user who stayed connected was
	// shown offline, even for a moment. (The gateway's lease lapsed during
	// the outage; the reaper, which lost NATS too, holds the lease's end
	// back while the gateway registers its connections again under a new
	// lease, and the end then finds none of them.)
	flaps := 0
	for _, w := range watchers {
		for _, u := range users {
			last, prev := time.Time{}, presence.Status("")
			for _, s := range w.history(u) {
				if s.at.After(backAt) && s.p.Status != prev {
					last = s.at
					if u[0] == 's' && s.p.Status == presence.Offline {
						flaps++
					}
				}
				prev = s.p.Status
			}
			if !last.IsZero() && last.Sub(backAt) > backWithin {
				t.Errorf("%s saw %s change %v after NATS was back, want within %v", w.user, u, last.Sub(backAt).Round(time.Millisecond), backWithin)
			}
		}
	}
	if flaps > 0 {
		t.Errorf("users who stayed connected were shown offline for a moment %d times (watchers x users) after NATS came back, want none", flaps)
	}
	if err := clients["s3"].setStatus(presence.Busy, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	want["s3"] = presence.Busy
	expectViews(t, 15*time.Second, "s3 busy after the restart", watchers, want)
	neverOffline(t, watchers, steady, settled, time.Now())
}
