package faulttest

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// TestGatewayDrain stops a gateway the way an orchestrator does, with
// SIGTERM to the greendot process. The gateway must stop accepting at once,
// close its sockets with 1001 spread over --drain-period, and exit cleanly.
// Its clients reconnect to the other gateway on 1001 (with jitter, as the
// protocol asks), within the offline grace, so no watcher, on either
// gateway, may ever see them offline; afterwards each has exactly one
// connection, on the other gateway, and keeps its chosen status.
func TestGatewayDrain(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 1)
	store := cl.openStore(1)
	tm := timings{ttl: 2 * time.Second, heartbeat: 500 * time.Millisecond, grace: 3 * time.Second, drain: 4 * time.Second,
		ackWait: 5 * time.Second, replicas: 1}
	startReaper(t, cl.urlsAs("reaper"), "reaper", tm)
	startFanout(t, cl.urlsAs("fanout"), "fanout", tm)
	draining, drainingWS := startChildGateway(t, cl, "gwdrain", tm)
	other := startGateway(t, cl.urlsAs("gateway"), "gwother", tm)
	urls := []string{drainingWS, other.WS}

	movers, watcherIDs := names("m", 12), names("w", 3)
	mutual(t, store, watcherIDs, movers)
	var watchers []*liveClient
	for i, id := range watcherIDs {
		if i == 0 {
			// One watcher is on the draining gateway and moves too.
			watchers = append(watchers, dialClient(t, id, urls, tm.heartbeat, true))
		} else {
			watchers = append(watchers, dialClient(t, id, []string{other.WS}, tm.heartbeat, false))
		}
	}
	clients := map[string]*liveClient{}
	want := truth{}
	for _, u := range movers {
		clients[u] = dialClient(t, u, urls, tm.heartbeat, true)
		want[u] = presence.Online
	}
	for _, w := range watchers {
		w.subscribe(movers...)
	}
	if err := clients["m0"].setStatus(presence.Busy, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	want["m0"] = presence.Busy
	expectViews(t, 15*time.Second, "everyone online", watchers, want)
	watching := time.Now()

	termAt := time.Now()
	draining.Signal(syscall.SIGTERM)
	// It stops accepting at once.
	waitFor(t, 10*time.Second, "the draining gateway refuses new sockets", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, drainingWS+"?user=late", client.Options{})
		if err != nil {
			return nil
		}
		_ = c.Abort()
		return fmt.Errorf("accepted a socket %v after SIGTERM", time.Since(termAt).Round(time.Millisecond))
	})
	everyone := append(slices.Clone(movers), watcherIDs[0])
	waitFor(t, tm.drain+30*time.Second, "every client moved to the other gateway", func() error {
		for _, u := range everyone {
			c := clients[u]
			if c == nil {
				c = watchers[0]
			}
			c.mu.Lock()
			moved := len(c.moves)
			c.mu.Unlock()
			if moved == 0 {
				return fmt.Errorf("%s has not moved", u)
			}
		}
		return nil
	})
	if err := draining.Wait(60 * time.Second); err != nil {
		t.Errorf("the drained gateway exited with %v, want a clean exit", err)
	}

	// Every socket was closed with 1001, spread over the drain period.
	var first, last time.Time
	for _, u := range everyone {
		c := clients[u]
		if c == nil {
			c = watchers[0]
		}
		ends := c.closeEvents()
		if len(ends) != 1 || ends[0].code != protocol.CloseGoingAway || ends[0].url != drainingWS {
			t.Errorf("%s: sockets ended %+v, want one 1001 from the draining gateway", u, ends)
			continue
		}
		if first.IsZero() || ends[0].at.Before(first) {
			first = ends[0].at
		}
		if ends[0].at.After(last) {
			last = ends[0].at
		}
	}
	t.Logf("1001s from %v to %v after SIGTERM (drain period %v)", first.Sub(termAt).Round(time.Millisecond), last.Sub(termAt).Round(time.Millisecond), tm.drain)
	if last.Sub(first) < tm.drain/2 {
		t.Errorf("1001s spread over %v, want at least half the drain period %v", last.Sub(first), tm.drain)
	}

	// The old connections live out the grace, then the reaper removes them:
	// each user ends with one connection, on the other gateway.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, tm.grace+20*time.Second, "one connection each, on the other gateway", func() error {
		for _, u := range movers {
			rec, _, err := store.Status(ctx, u)
			if err != nil {
				return fmt.Errorf("%s: %w", u, err)
			}
			if len(rec.Conns) != 1 {
				return fmt.Errorf("%s has %d connections", u, len(rec.Conns))
			}
			for _, ci := range rec.Conns {
				if ci.Gateway != "gwother" {
					return fmt.Errorf("%s is on %s", u, ci.Gateway)
				}
			}
		}
		return nil
	})
	expectViews(t, 15*time.Second, "everyone online after the drain", watchers, want)
	neverOffline(t, watchers, movers, watching, time.Now())
}
