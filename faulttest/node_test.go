package faulttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system"
)

// TestNATSNodeKilled kills one node of a three-node JetStream cluster in
// the middle of traffic: users changing status, connecting and leaving, on
// two gateways, with two reapers and two fanouts. The node killed leads the
// status bucket's stream, so a leader election happens under load, and
// every process connected to it must move to another node.
//
// The TTL (and so the gateways' lease TTL) is 15 s, longer than a
// JetStream election (4 to 9 s in nats-server): a lease must live through
// one. Then no watcher may
// see a connected user offline, nothing may arrive out of order, every
// status change must be confirmed (the gateway answers unavailable while
// no leader takes writes, and the client tries again, as apps do), and
// every watcher must end up seeing the truth. Finally the node comes back
// and catches up.
func TestNATSNodeKilled(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 3)
	store := cl.openStore(3)
	tm := timings{ttl: 15 * time.Second, heartbeat: time.Second, grace: time.Second, ackWait: 3 * time.Second, replicas: 3}
	for i := range 2 {
		startReaper(t, cl.urlsAs("reaper"), fmt.Sprintf("reaper%d", i+1), tm)
		startFanout(t, cl.urlsAs("fanout"), fmt.Sprintf("fanout%d", i+1), tm)
	}
	gws := []*system.Gateway{
		startGateway(t, cl.urlsAs("gateway"), "gw1", tm),
		startGateway(t, cl.urlsAs("gateway"), "gw2", tm),
	}

	steady, churners, watcherIDs := names("s", 6), names("c", 4), names("w", 2)
	users := append(append([]string{}, steady...), churners...)
	mutual(t, store, watcherIDs, users)
	var watchers []*liveClient
	for i, id := range watcherIDs {
		watchers = append(watchers, dialClient(t, id, []string{gws[i%2].WS}, tm.heartbeat, false))
	}
	clients := map[string]*liveClient{}
	changes := map[string][]change{}
	want := truth{}
	for i, u := range steady {
		changes[u] = []change{{time.Now(), presence.Online}}
		clients[u] = dialClient(t, u, []string{gws[i%2].WS}, tm.heartbeat, false)
		want[u] = presence.Online
	}
	for _, u := range churners {
		want[u] = presence.Offline
	}
	for _, w := range watchers {
		w.subscribe(users...)
	}
	expectViews(t, 15*time.Second, "steady users online", watchers, want)
	watching := time.Now()

	// Traffic: steady users cycle through statuses, churners connect and
	// leave, until stop is closed.
	stop := make(chan struct{})
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		errs    []error
		slowest time.Duration // the longest wait for a status confirmation
		cycles  int           // churners' connect and leave cycles
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	stopped := func(d time.Duration) bool {
		select {
		case <-stop:
			return true
		case <-time.After(d):
			return false
		}
	}
	cycle := []presence.Status{presence.Busy, presence.Away, presence.Online}
	for _, u := range steady {
		c := clients[u]
		wg.Go(func() {
			for i := 0; ; i++ {
				st := cycle[i%len(cycle)]
				mu.Lock()
				changes[u] = append(changes[u], change{time.Now(), st})
				mu.Unlock()
				start := time.Now()
				if err := c.setStatus(st, 45*time.Second); err != nil {
					fail(err)
					return
				}
				mu.Lock()
				slowest = max(slowest, time.Since(start))
				mu.Unlock()
				if stopped(300 * time.Millisecond) {
					return
				}
			}
		})
	}
	for i, u := range churners {
		wg.Go(func() {
			for !stopped(700 * time.Millisecond) {
				c, err := tryDialClient(t, u, []string{gws[i%2].WS}, tm.heartbeat, false, 45*time.Second)
				if err != nil {
					fail(err)
					return
				}
				stopped(700 * time.Millisecond)
				c.close()
				mu.Lock()
				cycles++
				mu.Unlock()
			}
		})
	}

	time.Sleep(3 * time.Second) // traffic before the fault
	victim := cl.streamLeader(presence.StreamName(presence.StatusBucket))
	if victim < 0 {
		t.Fatal("the status stream has no leader")
	}
	killedAt := time.Now()
	cl.kill(victim)
	t.Logf("killed %s, leader of the status stream", cl.nodes[victim].name)
	// Traffic goes on through the election and after it.
	time.Sleep(15 * time.Second)
	close(stop)
	wg.Wait()
	trafficEnd := time.Now()
	if len(errs) > 0 {
		t.Fatalf("traffic failed after the node was killed at %s: %v", killedAt.Format("15:04:05.000"), errors.Join(errs...))
	}
	n := 0
	for _, u := range steady {
		want[u] = changes[u][len(changes[u])-1].st.Public()
		n += len(changes[u]) - 1
	}
	t.Logf("traffic: %d status changes (the slowest confirmed after %v), %d connect and leave cycles",
		n, slowest.Round(time.Millisecond), cycles)
	expectViews(t, 60*time.Second, "every watcher sees the truth", watchers, want)
	neverOffline(t, watchers, steady, watching, trafficEnd)
	t.Logf("presences told again unchanged: %d", repeats(watchers, steady, watching))
	for _, w := range watchers {
		for _, u := range steady {
			inOrder(t, w, u, watching, changes[u])
		}
	}

	// The node comes back and catches up on every bucket.
	cl.restart(victim)
	cl.waitReady()
	cl.waitStreamsCurrent(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for u, st := range want {
		rec, _, err := store.Status(ctx, u)
		if errors.Is(err, presence.ErrNotFound) && st == presence.Offline {
			continue
		}
		if err != nil || rec.Public != st {
			t.Errorf("record of %s: %+v, %v; want %s", u, rec, err, st)
		}
	}
}
