package faulttest

import (
	"context"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// TestGatewayKilled kills a gateway process with SIGKILL on a three-node
// cluster. Its users must go offline for every watcher within the TTL plus
// 2 s (PROTOCOL.md), and the users of the other gateway must never be
// shown offline. The killed gateway is a child process of the greendot
// binary, so the kill is real: its sockets and its NATS connection end
// without a word, and nothing it would have done on a clean stop happens.
func TestGatewayKilled(t *testing.T) {
	cl := startCluster(t, 3)
	store := cl.openStore(3)
	tm := timings{ttl: time.Second, heartbeat: 300 * time.Millisecond, grace: time.Second, ackWait: 5 * time.Second, replicas: 3}
	startReaper(t, cl.urlsAs("reaper"), "reaper", tm)
	startFanout(t, cl.urlsAs("fanout"), "fanout", tm)
	doomed, doomedWS := startChildGateway(t, cl, "gwdoomed", tm)
	kept := startGateway(t, cl.urlsAs("gateway"), "gwkept", tm)

	onDoomed, onKept, watcherIDs := names("a", 5), names("b", 5), names("w", 3)
	users := append(append([]string{}, onDoomed...), onKept...)
	mutual(t, store, watcherIDs, users)
	var watchers []*liveClient
	for _, id := range watcherIDs {
		watchers = append(watchers, dialClient(t, id, []string{kept.WS}, tm.heartbeat, false))
	}
	clients := map[string]*liveClient{}
	for _, u := range onDoomed {
		clients[u] = dialClient(t, u, []string{doomedWS}, tm.heartbeat, false)
	}
	for _, u := range onKept {
		clients[u] = dialClient(t, u, []string{kept.WS}, tm.heartbeat, false)
	}
	for _, w := range watchers {
		w.subscribe(users...)
	}
	want := truth{}
	for _, u := range users {
		want[u] = presence.Online
	}
	expectViews(t, 15*time.Second, "everyone online", watchers, want)
	watching := time.Now()

	// A change made right before the kill is not lost.
	for _, u := range []string{"a1", "b1"} {
		if err := clients[u].setStatus(presence.Busy, 15*time.Second); err != nil {
			t.Fatal(err)
		}
		want[u] = presence.Busy
	}
	expectViews(t, 15*time.Second, "a1 and b1 busy", watchers, want)

	killedAt := time.Now()
	kill(t, doomed)
	for _, u := range onDoomed {
		want[u] = presence.Offline
	}
	expectViews(t, 30*time.Second, "the killed gateway's users offline", watchers, want)
	limit := tm.ttl + 2*time.Second
	var longest time.Duration
	for _, u := range onDoomed {
		longest = max(longest, offlineWithin(t, watchers, u, killedAt, limit))
	}
	t.Logf("the killed gateway's users were shown offline at most %v after the kill (limit %v)", longest.Round(time.Millisecond), limit)
	neverOffline(t, watchers, onKept, watching, time.Now())

	// The state agrees: the dead gateway's connections are gone from the
	// records, and their keys expired.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, u := range onDoomed {
		rec, _, err := store.Status(ctx, u)
		if err != nil || rec.Status != presence.Offline || len(rec.Conns) != 0 {
			t.Errorf("record of %s: %+v, %v", u, rec, err)
		}
		if u == "a1" && rec.Chosen != presence.Busy {
			t.Errorf("a1 lost its chosen status: %+v", rec)
		}
		keys, err := store.UserConns(ctx, u)
		if err != nil || len(keys) != 0 {
			t.Errorf("connection keys of %s: %v, %v", u, keys, err)
		}
	}
}
