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
	if b.AddSelf(3, presence.Away, 2, nil) {
		t.Fatal("a queued box asked to be scheduled for a self state")
	}
	if b.AddSelf(2, presence.Online, 1, nil) {
		t.Fatal("an older self state asked to be scheduled")
	}
	updates, self, oldest, rooms := b.Take(7, 10)
	if want := []presence.Presence{busy, online("carol")}; !slices.Equal(updates, want) {
		t.Errorf("updates = %v, want %v", updates, want)
	}
	if self != (Self{Rev: 3, Status: presence.Away, Devices: 2, Pending: true}) {
		t.Errorf("self = %+v, want rev 3 away 2 devices", self)
	}
	if oldest != 50 || rooms {
		t.Errorf("oldest = %d, rooms %v; want 50, none", oldest, rooms)
	}
	if paced, written := b.Paced(); paced != 17 || written != 7 {
		t.Errorf("paced at %d, written at %d; want 17 (the write at 7, and a pace) and 7", paced, written)
	}
	if u, s, _, _ := b.Take(8, 10); len(u) != 0 || s.Pending {
		t.Errorf("second Take = %v, %+v; want nothing", u, s)
	}
	if paced, written := b.Paced(); paced != 17 || written != 7 {
		t.Error("an empty Take moved the pace")
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
	if u, _, _, _ := b.Take(1, 10); u != nil {
		t.Fatalf("Take of a held box = %v", u)
	}
	b.Hold()
	if b.Release() {
		t.Fatal("released once of two holds, and asked to be scheduled")
	}
	if !b.Release() {
		t.Fatal("the last release of a box with changes did not ask to be scheduled")
	}
	if u, _, _, _ := b.Take(2, 10); len(u) != 1 {
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
	if _, _, _, rooms := b.Take(1, 10); !rooms {
		t.Fatal("Take did not report the rooms")
	}
	if _, _, _, rooms := b.Take(2, 10); rooms {
		t.Fatal("Take reported the rooms twice")
	}
	b.Hold()
	if _, _, _, rooms := b.Take(3, 10); b.AddRooms() || rooms {
		t.Fatal("a held box gave its rooms away")
	}
	if !b.Release() {
		t.Fatal("the release of a box with room changes did not ask to be scheduled")
	}
	if _, _, _, rooms := b.Take(40, 10); !rooms {
		t.Error("after the release: rooms not taken")
	}
	if paced, written := b.Paced(); paced != 50 || written != 40 {
		t.Errorf("after the release: paced at %d, written at %d; want 50, 40", paced, written)
	}
}

// TestBoxRemove: the change of a user no longer watched is dropped, also
// from a held box, and the others keep their order.
func TestBoxRemove(t *testing.T) {
	var b Box
	b.Hold()
	b.Add(online("bob"), 30)
	b.Add(online("carol"), 40)
	b.Add(online("dave"), 0)
	b.Remove("carol")
	b.Remove("nobody")
	if !b.Release() {
		t.Fatal("the release of a box with changes left did not ask to be scheduled")
	}
	if u, _, oldest, _ := b.Take(1, 10); !slices.Equal(u, []presence.Presence{online("bob"), online("dave")}) || oldest != 30 {
		t.Fatalf("Take = %v, oldest %d; want bob and dave, 30", u, oldest)
	}
	b.Hold()
	b.Add(online("bob"), 50)
	b.Remove("bob")
	if b.Release() {
		t.Error("a box whose only change was removed asked to be scheduled on release")
	}
	if u, _, oldest, _ := b.Take(2, 10); len(u) != 0 || oldest != 0 {
		t.Errorf("Take = %v, oldest %d; want nothing", u, oldest)
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
	updates, _, _, _ := k.box.Take(time.Now().UnixNano(), k.s.Pace())
	if len(updates) > 0 {
		k.wrote = append(k.wrote, time.Since(k.start))
		k.got = append(k.got, updates)
	}
	return buf, true
}

func (k *sock) add(p presence.Presence) {
	if k.box.Add(p, 0) {
		paced, written := k.box.Paced()
		k.s.Schedule(k, paced, written)
	}
}

func (k *sock) writes() ([]time.Duration, [][]presence.Presence) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.wrote), slices.Clone(k.got)
}

// run runs test with a scheduler whose pace is its interval: a socket is
// written at most once per interval.
func run(t *testing.T, interval time.Duration, test func(s *Scheduler, k *sock)) {
	runPaced(t, interval, interval, test)
}

func runPaced(t *testing.T, interval, pace time.Duration, test func(s *Scheduler, k *sock)) {
	synctest.Test(t, func(t *testing.T) {
		s := NewScheduler(interval, pace, 4)
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

// TestBurstThenPace: a socket whose changes come no faster than the pace
// gets each at once, a batch interval apart at least, up to PaceBurst in
// a row however close; beyond that, one frame per pace, coalesced; and
// after a quiet while, a whole burst again.
func TestBurstThenPace(t *testing.T) {
	const interval, pace = 10 * time.Millisecond, 50 * time.Millisecond
	runPaced(t, interval, pace, func(s *Scheduler, k *sock) {
		ms := time.Millisecond
		// Changes 4 ms apart, the first at 1 ms.
		time.Sleep(ms)
		for i := range 40 {
			k.add(online(fmt.Sprint("u", i)))
			synctest.Wait()
			time.Sleep(4 * ms)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		wrote, got := k.writes()
		// The first at once, then one per interval, the changes between
		// coalescing: 1, 11, 21, 31, 41 and 51 ms, as the pace's
		// allowance (four paces) runs out (the pace stands at 301 ms at
		// the sixth write, less 200); then one per pace: 101, 151, and
		// 201 for the changes of 153 and 157.
		want := []time.Duration{1 * ms, 11 * ms, 21 * ms, 31 * ms, 41 * ms, 51 * ms, 101 * ms, 151 * ms, 201 * ms}
		if !slices.Equal(wrote, want) {
			t.Fatalf("written at %v, want %v", wrote, want)
		}
		n := 0
		for _, frame := range got {
			n += len(frame)
		}
		if n != 40 {
			t.Errorf("%d changes written, want all 40", n)
		}

		// Quiet for a second: a burst again, a batch interval apart.
		start := time.Now()
		for i := range 3 {
			k.add(online(fmt.Sprint("v", i)))
			synctest.Wait()
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		wrote, _ = k.writes()
		base := start.Sub(k.start)
		if want := []time.Duration{base, base + interval}; !slices.Equal(wrote[9:], want) {
			t.Errorf("after a quiet second, written at %v, want %v", wrote[9:], want)
		}
	})
}
