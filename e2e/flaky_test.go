package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/tcpproxy"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// The flaky network's size and timings.
const (
	flakyPhones   = 8
	flakyDesktops = 4
	flakyWatchers = 2
	flakyChurn    = 12 * time.Second
	// flakyGrace is the phones' background grace; a phone comes back
	// well within it (at most flakyDown after its cut, plus the TTL when
	// its path died silently).
	flakyGrace = 4 * time.Second
	flakyDown  = 1500 * time.Millisecond
)

// seen is one presence a watcher was given.
type flakySeen struct {
	at     time.Time
	status presence.Status
}

// flakyWatcher records every presence it is given, by user.
type flakyWatcher struct {
	mu    sync.Mutex
	views map[string][]flakySeen
}

func (w *flakyWatcher) read(c *client.Conn) {
	for {
		m, _, err := c.Read()
		if err != nil {
			return
		}
		list := m.Updates
		if m.Type == protocol.TypePresenceInit {
			list = m.Users
		}
		now := time.Now()
		w.mu.Lock()
		for _, p := range list {
			w.views[p.UserID] = append(w.views[p.UserID], flakySeen{now, p.Status})
		}
		w.mu.Unlock()
	}
}

func (w *flakyWatcher) view(user string) []flakySeen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]flakySeen(nil), w.views[user]...)
}

// TestFlakyNetworkBackground: phones whose apps are in the background,
// each behind a loopback proxy that cuts its TCP connections at random
// every second or two (a close, a reset, or a path that goes silent),
// come back within their background grace, while desktops change their
// statuses. Watchers never see a phone's user offline while a grace of
// theirs is live, and see every desktop's last status; once the phones
// stop coming back, watchers see them offline within the grace and the
// usual bound.
func TestFlakyNetworkBackground(t *testing.T) {
	tooltest.Long(t)
	t.Parallel()
	seed := rand.Uint64()
	if s, err := strconv.ParseUint(os.Getenv(seedEnv), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (%s=%d replays the schedule)", seed, seedEnv, seed)
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{BackgroundGrace: flakyGrace}})
	gw := sys.Gateway()
	user := func(kind string, i int) string { return fmt.Sprintf("%s%d", kind, i) }
	for w := range flakyWatchers {
		for i := range flakyPhones {
			sys.Mutual(user("watcher", w), user("phone", i))
		}
		for i := range flakyDesktops {
			sys.Mutual(user("watcher", w), user("desk", i))
		}
	}
	var readers sync.WaitGroup
	defer readers.Wait()
	dial := func(url string) (*client.Conn, error) {
		c, err := client.Dial(context.Background(), url, client.Options{})
		if err != nil {
			return nil, err
		}
		stop := systest.KeepAlive(c, systest.Heartbeat)
		readers.Go(func() {
			defer stop()
			for {
				if _, _, err := c.Read(); err != nil {
					return
				}
			}
		})
		return c, nil
	}

	watchers := make([]*flakyWatcher, flakyWatchers)
	for w := range watchers {
		watchers[w] = &flakyWatcher{views: make(map[string][]flakySeen)}
		c, err := client.Dial(context.Background(), gw.WS+"?user="+user("watcher", w), client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Abort() }()
		defer systest.KeepAlive(c, systest.Heartbeat)()
		ids := make([]string, 0, flakyPhones+flakyDesktops)
		for i := range flakyPhones {
			ids = append(ids, user("phone", i))
		}
		for i := range flakyDesktops {
			ids = append(ids, user("desk", i))
		}
		if err := c.Subscribe("s", ids...); err != nil {
			t.Fatal(err)
		}
		readers.Go(func() { watchers[w].read(c) })
	}

	// The desktops: each change of status is the newest truth.
	desks := make([]*client.Conn, flakyDesktops)
	truth := make(map[string]presence.Status)
	for i := range desks {
		c, err := dial(gw.WS + "?user=" + user("desk", i) + "&platform=desktop")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Abort() }()
		desks[i], truth[user("desk", i)] = c, presence.Online
	}

	end := time.Now().Add(flakyChurn)
	var wg sync.WaitGroup
	lastCut := make([]time.Time, flakyPhones)
	cuts := make([]int, flakyPhones)
	for i := range flakyPhones {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		proxy := tcpproxy.Start(t, gw.Addr, nil)
		url := "ws://" + proxy.Addr() + "/ws?user=" + user("phone", i) + "&platform=mobile"
		wg.Go(func() {
			for {
				c, err := dial(url)
				if err != nil {
					t.Errorf("phone%d: dial: %v", i, err)
					return
				}
				if err := c.Background(flakyGrace.Milliseconds()); err != nil {
					t.Errorf("phone%d: background: %v", i, err)
				}
				time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond) // the network's schedule, not a wait for the system
				switch rng.IntN(3) {
				case 0:
					proxy.Cut()
				case 1:
					proxy.Reset()
				default:
					for _, l := range proxy.Links() {
						l.Hold()
					}
				}
				_ = c.Abort()
				cuts[i]++
				lastCut[i] = time.Now()
				if time.Now().After(end) {
					proxy.Cut()
					return
				}
				time.Sleep(time.Duration(100+rng.IntN(int(flakyDown/time.Millisecond)-100)) * time.Millisecond)
			}
		})
	}
	rng := rand.New(rand.NewPCG(seed, 1<<32))
	statuses := []presence.Status{presence.Online, presence.Away, presence.Busy}
	for changes := 0; time.Now().Before(end) && changes < 1000; changes++ {
		i := rng.IntN(flakyDesktops)
		st := statuses[rng.IntN(len(statuses))]
		if err := desks[i].SetStatus(string(st)); err != nil {
			t.Fatal(err)
		}
		truth[user("desk", i)] = st
		time.Sleep(200 * time.Millisecond) // the desktops' pace
	}
	wg.Wait()

	// Every phone's last grace ends, and then the usual bound (its TTL
	// when its path went silent, and the offline slack).
	deadline := time.Now().Add(flakyGrace + systest.TTL + offlineSlack + propagation)
	for _, w := range watchers {
		for {
			done := true
			for i := range flakyPhones {
				if v := w.view(user("phone", i)); len(v) == 0 || v[len(v)-1].status != presence.Offline {
					done = false
				}
			}
			for u, st := range truth {
				if v := w.view(u); len(v) == 0 || v[len(v)-1].status != st {
					done = false
				}
			}
			if done || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond) // polling the watchers' records, bounded by deadline
		}
	}
	for wi, w := range watchers {
		for u, st := range truth {
			if v := w.view(u); len(v) == 0 || v[len(v)-1].status != st {
				t.Errorf("watcher%d: %s last seen %v, want %s", wi, u, v, st)
			}
		}
		for i := range flakyPhones {
			v := w.view(user("phone", i))
			// Offline is allowed before the phone's first connection was
			// seen, and once its last grace may have ended.
			graceEnd := lastCut[i].Add(flakyGrace - systest.Heartbeat - 100*time.Millisecond)
			connected := false
			for _, s := range v {
				switch {
				case s.status != presence.Offline:
					connected = true
				case connected && s.at.Before(graceEnd):
					t.Errorf("watcher%d: phone%d offline at %s, %v before its last grace could end (%d cuts): a flap", wi, i, s.at.Format("15:04:05.000"), graceEnd.Sub(s.at).Round(time.Millisecond), cuts[i])
				}
			}
			if !connected {
				t.Errorf("watcher%d: phone%d never seen connected: %v", wi, i, v)
			}
			if len(v) == 0 || v[len(v)-1].status != presence.Offline {
				t.Errorf("watcher%d: phone%d not offline by %v after its last cut: %v", wi, i, flakyGrace+systest.TTL+offlineSlack+propagation, v)
			}
		}
	}
	total := 0
	for _, n := range cuts {
		total += n
	}
	t.Logf("%d cuts of %d phones in %v; %d desktops changed status", total, flakyPhones, flakyChurn, flakyDesktops)
}
