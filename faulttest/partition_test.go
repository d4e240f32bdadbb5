package faulttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/pkg/presence"
)

// proxy passes TCP connections through to a NATS server, and can cut them
// off: a network partition between one process and NATS.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns []net.Conn
	wg    sync.WaitGroup
}

// startProxy listens on loopback and passes every connection to target.
func startProxy(tb testing.TB, target string) *proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		_ = ln.Close()
		p.sever()
		p.wg.Wait()
	})
	return p
}

// url is the proxy's NATS URL.
func (p *proxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		p.wg.Go(func() { pipe(up, c) })
		p.wg.Go(func() { pipe(c, up) })
	}
}

// sever closes every connection through the proxy.
func (p *proxy) sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// partition cuts every connection through the proxy and refuses new ones
// until heal.
func (p *proxy) partition() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
	p.sever()
}

func (p *proxy) heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// TestGatewayPartitioned cuts a gateway off NATS for three times its lease
// TTL while its users stay connected to it. Its lease ends, and a reaper
// rightly takes its users out of their records: watchers on another
// gateway see them offline. Once the partition heals, the gateway finds
// its lease gone, takes a new one and registers its users again: they are
// online within seconds, their sockets never closed, and nothing the
// reaper or a sweep does about the old lease touches the new one.
func TestGatewayPartitioned(t *testing.T) {
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
