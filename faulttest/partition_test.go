package faulttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/internal/tcpproxy"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/pkg/signature"
)

// proxy passes TCP connections through to a NATS server, and can cut them
// off: a network partition between one process and NATS.
type proxy struct {
	*tcpproxy.Proxy
	target string
}

// startProxy listens on loopback and passes every connection to target.
func startProxy(tb testing.TB, target string) *proxy {
	tb.Helper()
	return &proxy{Proxy: tcpproxy.Start(tb, target, nil), target: target}
}

// url is the proxy's NATS URL.
func (p *proxy) url() string { return "nats://" + p.Addr() }

// partition cuts every connection through the proxy and refuses new ones
// until heal.
func (p *proxy) partition() {
	p.SetTarget("")
	p.Cut()
}

func (p *proxy) heal() { p.SetTarget(p.target) }

// TestGatewayPartitioned cuts a gateway off NATS for three times its lease
// TTL or more while its users stay connected to it: its HTTP API answers
// 503 unavailable once its read of NATS has taken the 10 s it may (the
// partition lasts that long). Its lease ends, and a reaper
// rightly takes its users out of their records: watchers on another
// gateway see them offline. Once the partition heals, the gateway finds
// its lease gone, takes a new one and registers its users again: they are
// online within seconds, their sockets never closed, and nothing the
// reaper or a sweep does about the old lease touches the new one.
func TestGatewayPartitioned(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 1)
	store := cl.openStore(1)
	tm := timings{ttl: time.Second, heartbeat: 300 * time.Millisecond, grace: time.Second, ackWait: 3 * time.Second, replicas: 1}
	startReaper(t, cl.urlsAs("reaper"), "reaper", tm)
	startFanout(t, cl.urlsAs("fanout"), "fanout", tm)
	px := startProxy(t, strings.TrimPrefix(cl.urls(), "nats://"))
	cutOff := startGateway(t, strings.Replace(px.url(), "nats://", "nats://gateway:"+rolePasswords["gateway"]+"@", 1), "gwcut", tm)
	other := startGateway(t, cl.urlsAs("gateway"), "gwother", tm)

	users, watcherIDs := names("p", 4), names("w", 2)
	mutual(t, store, watcherIDs, users)
	var watchers []*liveClient
	for _, id := range watcherIDs {
		watchers = append(watchers, dialClient(t, id, []string{other.WS}, tm.heartbeat, false))
	}
	clients := make([]*liveClient, len(users))
	want := truth{}
	for i, u := range users {
		clients[i] = dialClient(t, u, []string{cutOff.WS}, tm.heartbeat, false)
		want[u] = presence.Online
	}
	for _, w := range watchers {
		w.subscribe(users...)
	}
	expectViews(t, 15*time.Second, "everyone online", watchers, want)
	ctx := context.Background()
	epochOf := func(u string) (string, error) {
		rec, _, err := store.Status(ctx, u)
		if err != nil {
			return "", err
		}
		for _, c := range rec.Conns {
			return c.Lease, nil
		}
		return "", fmt.Errorf("%s has no connection", u)
	}
	before, err := epochOf(users[0])
	if err != nil {
		t.Fatal(err)
	}

	px.partition()
	cutAt := time.Now()
	// Its HTTP API answers 503 unavailable once a read of NATS has taken
	// the time it may (10 s), and nothing from a cache.
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(cutOff.HTTP + "/api/presence/users/" + users[0] + "?user=" + watcherIDs[0])
	if err != nil {
		t.Fatal(err)
	}
	var answer struct{ Error string }
	err = json.NewDecoder(resp.Body).Decode(&answer)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || err != nil || answer.Error != "unavailable" {
		t.Errorf("GET a user's presence while cut off: %d %+v (%v), want 503 unavailable", resp.StatusCode, answer, err)
	}
	t.Logf("the cut-off gateway's API answered %d after %v", resp.StatusCode, time.Since(cutAt).Round(time.Millisecond))
	for _, u := range users {
		want[u] = presence.Offline
	}
	expectViews(t, 15*time.Second, "the cut-off gateway's users offline once its lease ended", watchers, want)
	waitFor(t, 10*time.Second, "three lease TTLs", func() error {
		if time.Since(cutAt) < 3*tm.ttl {
			return errors.New("not yet")
		}
		return nil
	})
	px.heal()
	healedAt := time.Now()
	for _, u := range users {
		want[u] = presence.Online
	}
	expectViews(t, 15*time.Second, "the cut-off gateway's users online again", watchers, want)
	t.Logf("partitioned for %v; everyone online again %v after it healed", healedAt.Sub(cutAt).Round(time.Millisecond), time.Since(healedAt).Round(time.Millisecond))

	// Registered again under a new lease, which the old one's end and a
	// sweep leave alone.
	var after string
	waitFor(t, 10*time.Second, "every user under the new lease", func() error {
		for _, u := range users {
			e, err := epochOf(u)
			if err != nil {
				return err
			}
			if e == before {
				return fmt.Errorf("%s still under the old lease", u)
			}
			after = e
		}
		return nil
	})
	reply, err := adminclient.Sweep(ctx, store.NATS())
	if err != nil {
		t.Fatal(err)
	}
	if reply.Removed != 0 {
		t.Errorf("a sweep after the partition removed %d connections", reply.Removed)
	}
	stable := time.Now()
	for _, u := range users {
		e, err := epochOf(u)
		if err != nil || e != after {
			t.Errorf("%s: lease %q, %v; want still %q", u, e, err, after)
		}
		keys, err := store.UserLeaseConns(ctx, u)
		if err != nil || len(keys) != 1 {
			t.Errorf("%s's keys: %v, %v; want one, under the new lease", u, keys, err)
		}
		for k := range keys {
			if k.Epoch != after {
				t.Errorf("%s's key is under %q, want %q", u, k.Epoch, after)
			}
		}
	}
	neverOffline(t, watchers, users, healedAt.Add(5*time.Second), stable)
	if n, _ := metricstest.Value(cutOff.Registry(), "greendot_gateway_leases_lost_total"); n != 1 {
		t.Errorf("the gateway lost its lease %v times, want once", n)
	}
	for _, c := range clients {
		if ev := c.closeEvents(); len(ev) > 0 {
			t.Errorf("%s's socket was closed during the partition: %+v", c.user, ev)
		}
	}
}

// TestAppAnswersDroppedOnReconnect cuts a gateway under the app policy off
// NATS while the app withdraws an answer and publishes the invalidation:
// the gateway cannot hear it, and the answer it cached is stale. Once the
// link is back, the gateway drops its cached answers and asks again: the
// watcher is told it may no longer watch, and is shown nothing more of that
// user.
func TestAppAnswersDroppedOnReconnect(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 1)
	cl.openStore(1)
	secret := []byte("faulttest app callout: a shared secret of 32 bytes or more")
	var allowBob atomic.Bool
	allowBob.Store(true)
	appSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if err := signature.Verify(secret, r.Header.Get(signature.Header), body, time.Now(), 5*time.Minute); err != nil {
			t.Errorf("a question without a good signature: %v", err)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var q struct {
			Watcher string   `json:"watcher"`
			Targets []string `json:"targets"`
			List    bool     `json:"list"`
		}
		if err := json.Unmarshal(body, &q); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// Alice may watch carol, and bob while allowBob is set.
		allow := []string{}
		if q.Watcher == "alice" {
			for _, u := range q.Targets {
				if u == "carol" || u == "bob" && allowBob.Load() {
					allow = append(allow, u)
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"allow": allow})
	}))
	defer appSrv.Close()

	tm := timings{ttl: 30 * time.Second, heartbeat: time.Second, grace: time.Second, ackWait: 3 * time.Second, replicas: 1,
		edit: func(c *gateway.Config) {
			c.Policy = gateway.PolicyApp
			c.AppURL, c.AppSecret, c.AppTimeout = appSrv.URL, secret, 10*time.Second
		}}
	startFanout(t, cl.urlsAs("fanout"), "fanout", tm)
	px := startProxy(t, strings.TrimPrefix(cl.urls(), "nats://"))
	gw := startGateway(t, strings.Replace(px.url(), "nats://", "nats://gateway:"+rolePasswords["gateway"]+"@", 1), "gwapp", tm)

	bob := dialClient(t, "bob", []string{gw.WS}, tm.heartbeat, false)
	carol := dialClient(t, "carol", []string{gw.WS}, tm.heartbeat, false)
	alice := dialClient(t, "alice", []string{gw.WS}, tm.heartbeat, false)
	alice.subscribe("bob", "carol")
	expectViews(t, 15*time.Second, "alice sees bob and carol", []*liveClient{alice}, truth{"bob": presence.Online, "carol": presence.Online})
	seen := len(alice.history("bob"))

	// Cut off, the gateway misses the invalidation of alice -> bob.
	px.partition()
	allowBob.Store(false)
	nc := cl.connect("app")
	if err := nc.Publish(gateway.InvalidateSubject, []byte(`{"watcher":"alice","target":"bob"}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	px.heal()

	waitFor(t, 30*time.Second, "alice denied bob after the reconnect", func() error {
		alice.mu.Lock()
		defer alice.mu.Unlock()
		for _, m := range alice.errs {
			if m.Type == protocol.TypeDenied && m.UserID == "bob" {
				if m.Reason != protocol.ReasonNotAllowed {
					return fmt.Errorf("bob denied with %q, want %q", m.Reason, protocol.ReasonNotAllowed)
				}
				return nil
			}
		}
		return fmt.Errorf("no denied for bob; errors: %v", alice.errs)
	})

	// Bob's change is not shown to alice, nor anything else of bob since
	// the partition; carol's change, made after bob's, is.
	if err := bob.setStatus(presence.Away, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := carol.setStatus(presence.Away, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	expectViews(t, 15*time.Second, "alice sees carol's change", []*liveClient{alice}, truth{"carol": presence.Away})
	for _, s := range alice.history("bob")[seen:] {
		t.Errorf("alice was shown bob %s at %s, after the app refused", s.p.Status, s.at.Format("15:04:05.000"))
	}
}
