package outbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

func online(user string) presence.Presence {
	return presence.Presence{UserID: user, Status: presence.Online}
}

func TestBoxKeepsTheNewestChangePerUser(t *testing.T) {
	var b Box
	if !b.Add(online("bob"), 100) {
		t.Fatal("the first change did not ask to be scheduled")
	}
	busy := presence.Presence{UserID: "bob", Status: presence.Busy}
	if b.Add(busy, 50) || b.Add(online("carol"), 0) {
		t.Fatal("a queued box asked to be scheduled again")
	}
	if b.AddSelf(3, presence.Away, 2) {
		t.Fatal("a queued box asked to be scheduled for a self state")
	}
	if b.AddSelf(2, presence.Online, 1) {
		t.Fatal("an older self state asked to be scheduled")
	}
	updates, self, oldest := b.Take(7)
	if want := []presence.Presence{busy, online("carol")}; !slices.Equal(updates, want) {
		t.Errorf("updates = %v, want %v", updates, want)
	}
	if self != (Self{Rev: 3, Status: presence.Away, Devices: 2, Pending: true}) {
		t.Errorf("self = %+v, want rev 3 away 2 devices", self)
	}
	if oldest != 50 {
		t.Errorf("oldest = %d, want 50", oldest)
	}
	if b.FlushedAt() != 7 {
		t.Errorf("flushed at %d, want 7", b.FlushedAt())
	}
	if u, s, _ := b.Take(8); len(u) != 0 || s.Pending {
		t.Errorf("second Take = %v, %+v; want nothing", u, s)
	}
	if b.FlushedAt() != 7 {
		t.Error("an empty Take moved the flush time")
	}
	if !b.Add(online("dave"), 0) {
		t.Error("a change after Take did not ask to be scheduled")
	}
}

func TestBoxHold(t *testing.T) {
	var b Box
	b.Hold()
	if b.Add(online("bob"), 0) {
		t.Fatal("a held box asked to be scheduled")
	}
	if u, _, _ := b.Take(1); u != nil {
		t.Fatalf("Take of a held box = %v", u)
	}
	b.Hold()
	if b.Release() {
		t.Fatal("released once of two holds, and asked to be scheduled")
	}
	if !b.Release() {
		t.Fatal("the last release of a box with changes did not ask to be scheduled")
	}
	if u, _, _ := b.Take(2); len(u) != 1 {
		t.Fatalf("Take after release = %v, want bob", u)
	}
	b.Hold()
	if b.Release() {
		t.Error("an empty box asked to be scheduled on release")
	}
}

// TestBoxRooms: room frames wait like other changes, and a hold keeps
// them back until its release.
func TestBoxRooms(t *testing.T) {
	var b Box
	if !b.AddRooms() {
		t.Fatal("the first room change did not ask to be scheduled")
	}
	if b.AddRooms() {
		t.Fatal("a queued box asked to be scheduled again")
	}
	b.Take(1)
	if !b.TakeRooms(1) || b.TakeRooms(2) {
		t.Fatal("TakeRooms did not report the rooms once")
	}
	b.Hold()
	if b.AddRooms() || b.TakeRooms(3) {
		t.Fatal("a held box gave its rooms away")
	}
	if !b.Release() {
		t.Fatal("the release of a box with room changes did not ask to be scheduled")
	}
	if !b.TakeRooms(4) || b.FlushedAt() != 4 {
		t.Errorf("after the release: rooms not taken, or flushed at %d", b.FlushedAt())
	}
}

// sock is a Flusher that records when it was written.
type sock struct {
	s     *Scheduler
	box   Box
	mu    sync.Mutex
	busy  bool
	wrote []time.Duration // since start
	got   [][]presence.Presence
	start time.Time
}

func (k *sock) Flush(buf []byte) ([]byte, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.busy {
		return buf, false
	}
	updates, _, _ := k.box.Take(time.Now().UnixNano())
	if len(updates) > 0 {
		k.wrote = append(k.wrote, time.Since(k.start))
		k.got = append(k.got, updates)
	}
	return buf, true
}

func (k *sock) add(p presence.Presence) {
	if k.box.Add(p, 0) {
		k.s.Schedule(k, k.box.FlushedAt())
	}
}

func (k *sock) writes() ([]time.Duration, [][]presence.Presence) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.wrote), slices.Clone(k.got)
}

func run(t *testing.T, interval time.Duration, test func(s *Scheduler, k *sock)) {
	synctest.Test(t, func(t *testing.T) {
		s := NewScheduler(interval, 4)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			s.Run(ctx)
			close(done)
		}()
		defer func() {
			cancel()
			<-done
		}()
		test(s, &sock{s: s, start: time.Now()})
	})
}

// TestQuietSocketIsWrittenAtOnce: no clock stands between a change and a
// socket that was not written to for an interval.
func TestQuietSocketIsWrittenAtOnce(t *testing.T) {
	run(t, 50*time.Millisecond, func(s *Scheduler, k *sock) {
		k.add(online("bob"))
		synctest.Wait()
		wrote, _ := k.writes()
		if !slices.Equal(wrote, []time.Duration{0}) {
			t.Errorf("written at %v, want at once", wrote)
		}
	})
}

// TestBusySocketCoalesces: changes that come faster than the interval
// wait for the rest of it and go out together, the newest of each user.
func TestBusySocketCoalesces(t *testing.T) {
	const interval = 50 * time.Millisecond
	run(t, interval, func(s *Scheduler, k *sock) {
		k.add(online("bob"))
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		k.add(online("carol"))
		time.Sleep(10 * time.Millisecond)
		k.add(presence.Presence{UserID: "carol", Status: presence.Busy})
		time.Sleep(time.Second)
		synctest.Wait()
		wrote, got := k.writes()
		if !slices.Equal(wrote, []time.Duration{0, interval}) {
			t.Errorf("written at %v, want at 0 and %v", wrote, interval)
		}
		if len(got) != 2 || len(got[1]) != 1 || got[1][0].Status != presence.Busy {
			t.Errorf("frames %v, want carol's newest state in the second", got)
		}
		// A change a whole interval after the last write goes out at once.
		k.add(online("dave"))
		synctest.Wait()
		wrote, _ = k.writes()
		if want := time.Second + 20*time.Millisecond; len(wrote) != 3 || wrote[2] != want {
			t.Errorf("written at %v, want a third write at %v", wrote, want)
		}
	})
}

// TestBusyWriterIsRetried: a socket busy with another write (a reply) is
// tried again shortly, and nothing is lost.
func TestBusyWriterIsRetried(t *testing.T) {
	run(t, 50*time.Millisecond, func(s *Scheduler, k *sock) {
		k.mu.Lock()
		k.busy = true
		k.mu.Unlock()
		k.add(online("bob"))
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		if wrote, _ := k.writes(); len(wrote) != 0 {
			t.Fatalf("a busy socket was written: %v", wrote)
		}
		if s.Pending() != 1 {
			t.Errorf("pending = %d, want 1", s.Pending())
		}
		k.mu.Lock()
		k.busy = false
		k.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if wrote, _ := k.writes(); len(wrote) != 1 {
			t.Errorf("after the other write ended: written %v, want once", wrote)
		}
		if s.Pending() != 0 {
			t.Errorf("pending = %d, want 0", s.Pending())
		}
	})
}

// TestManySockets: each socket keeps its own interval: a change that
// comes within an interval of the socket's last write waits for its end,
// a later one goes out at once.
func TestManySockets(t *testing.T) {
	const interval = 50 * time.Millisecond
	run(t, interval, func(s *Scheduler, _ *sock) {
		socks := make([]*sock, 100)
		start := time.Now()
		for i := range socks {
			socks[i] = &sock{s: s, start: start}
			socks[i].add(online(fmt.Sprint("u", i)))
		}
		synctest.Wait()
		for i, k := range socks {
			time.Sleep(time.Millisecond)
			k.add(online(fmt.Sprint("v", i)))
		}
		time.Sleep(time.Second)
		synctest.Wait()
		for i, k := range socks {
			wrote, _ := k.writes()
			want := max(interval, time.Duration(i+1)*time.Millisecond)
			if len(wrote) != 2 || wrote[0] != 0 || wrote[1] != want {
				t.Fatalf("socket %d written at %v, want at 0 and %v", i, wrote, want)
			}
		}
	})
}
