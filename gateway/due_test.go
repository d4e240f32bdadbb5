package gateway

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// ringStep is the step of the rings these tests make: 100ms, starting at
// t0, so that tick k's time is t0 + (k-1)*step.
const (
	ringStep = int64(100 * time.Millisecond)
	t0       = int64(1_000_000 * time.Second)
)

// takeAt returns the connections the ring hands out for every tick whose
// time has come by now, in order.
func takeAt(d *dueRing, now int64) []*conn {
	var out []*conn
	for {
		got, ok := d.take(now, nil)
		if !ok {
			return out
		}
		out = append(out, got...)
	}
}

func TestDueRingLooksWhenDue(t *testing.T) {
	d := newDueRing(time.Duration(ringStep), time.Second, t0)
	a, b := &conn{}, &conn{}
	d.at(a, t0+250*int64(time.Millisecond)) // tick 4, at t0+300ms
	d.at(b, t0+300*int64(time.Millisecond)) // the same tick
	if got := takeAt(d, t0+299*int64(time.Millisecond)); len(got) != 0 {
		t.Fatalf("before their time: %d handed out", len(got))
	}
	if got := takeAt(d, t0+300*int64(time.Millisecond)); !slices.Equal(got, []*conn{a, b}) {
		t.Fatalf("at their time: got %v, want both", got)
	}
	if got := takeAt(d, t0+2*int64(time.Second)); len(got) != 0 {
		t.Fatalf("after they were handed out: %d more", len(got))
	}
	if a.due != 0 || b.due != 0 {
		t.Errorf("due = %d, %d after they were handed out, want 0", a.due, b.due)
	}
}

func TestDueRingEarlierReplacesLater(t *testing.T) {
	d := newDueRing(time.Duration(ringStep), time.Second, t0)
	c := &conn{}
	d.at(c, t0+800*int64(time.Millisecond))
	d.at(c, t0+200*int64(time.Millisecond)) // a token that expires sooner
	d.at(c, t0+500*int64(time.Millisecond)) // later than the one it has
	if got := takeAt(d, t0+200*int64(time.Millisecond)); !slices.Equal(got, []*conn{c}) {
		t.Fatalf("at the earliest time: got %v, want it", got)
	}
	if got := takeAt(d, t0+2*int64(time.Second)); len(got) != 0 {
		t.Fatalf("its later places handed it out %d more times", len(got))
	}
}

func TestDueRingSkipsClosed(t *testing.T) {
	d := newDueRing(time.Duration(ringStep), time.Second, t0)
	open, closed := &conn{}, &conn{}
	d.at(open, t0)
	d.at(closed, t0)
	closed.closed.Store(true)
	if got := takeAt(d, t0+int64(time.Second)); !slices.Equal(got, []*conn{open}) {
		t.Fatalf("got %v, want the open one alone", got)
	}
}

func TestDueRingPastAndBeyond(t *testing.T) {
	d := newDueRing(time.Duration(ringStep), time.Second, t0) // 12 slots
	past, beyond := &conn{}, &conn{}
	d.at(past, t0-int64(time.Hour))
	d.at(beyond, t0+int64(time.Hour))
	if got := takeAt(d, t0); !slices.Equal(got, []*conn{past}) {
		t.Fatalf("on the first tick: got %v, want the one already due", got)
	}
	// Beyond the span, it is looked at on the ring's last tick: 11 steps
	// after the first.
	if got := takeAt(d, t0+10*ringStep); len(got) != 0 {
		t.Fatalf("before the span's end: %d handed out", len(got))
	}
	if got := takeAt(d, t0+11*ringStep); !slices.Equal(got, []*conn{beyond}) {
		t.Fatalf("at the span's end: got %v, want the far one", got)
	}
}

func TestDueRingCatchesUp(t *testing.T) {
	d := newDueRing(time.Duration(ringStep), time.Second, t0)
	cs := make([]*conn, 5)
	for i := range cs {
		cs[i] = &conn{}
	}
	for i := len(cs) - 1; i >= 0; i-- { // put in the reverse order
		d.at(cs[i], t0+int64(i)*ringStep)
	}
	// Late by five steps: every tick missed, in order.
	if got := takeAt(d, t0+5*ringStep); !slices.Equal(got, cs) {
		t.Fatalf("got %v, want all five in their ticks' order", got)
	}
}

// TestDueRingRun runs the ring in virtual time: a connection whose look
// puts it a second further each time is looked at once a second, on the
// tick, and a closed one no more.
func TestDueRingRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		d := newDueRing(100*time.Millisecond, time.Second, start.UnixNano())
		var (
			mu    sync.Mutex
			looks = map[*conn][]time.Duration{}
		)
		a, b := &conn{}, &conn{}
		d.at(a, start.Add(time.Second).UnixNano())
		d.at(b, start.Add(time.Second).UnixNano())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			d.run(ctx, func(c *conn, now int64) (int64, bool) {
				mu.Lock()
				looks[c] = append(looks[c], time.Duration(now-start.UnixNano()))
				mu.Unlock()
				if c == b {
					c.closed.Store(true) // ended by its first look
					return 0, false
				}
				return now + int64(time.Second), true
			})
		}()
		time.Sleep(3500 * time.Millisecond)
		cancel()
		<-done
		want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
		if !slices.Equal(looks[a], want) {
			t.Errorf("a looked at %v, want %v", looks[a], want)
		}
		if !slices.Equal(looks[b], want[:1]) {
			t.Errorf("b looked at %v, want once, at 1s", looks[b])
		}
	})
}

// TestDueRingLetsEndedGo: connections that end, or move to an earlier
// tick, leave their slot once they are half of it, so that the ring holds
// no ended connection for long; those still due are handed out as before.
func TestDueRingLetsEndedGo(t *testing.T) {
	d := newDueRing(time.Duration(ringStep), time.Second, t0)
	at := t0 + 500*int64(time.Millisecond)
	slot := func() []*conn { return d.slots[(at-d.base)/d.step%int64(len(d.slots))] }
	var conns []*conn
	for range 10 {
		c := &conn{}
		d.at(c, at)
		conns = append(conns, c)
	}
	for _, c := range conns[:4] {
		c.closed.Store(true)
		d.ended(c)
	}
	if n := len(slot()); n != 10 {
		t.Fatalf("slot of %d after 4 of 10 ended, want 10: it is compacted at half", n)
	}
	d.at(conns[4], t0+100*int64(time.Millisecond)) // an earlier deadline
	if n := len(slot()); n != 5 {
		t.Fatalf("slot of %d after 5 of 10 left, want the 5 due", n)
	}
	if held := slot()[:cap(slot())]; slices.ContainsFunc(held, func(c *conn) bool { return c != nil && c.due != (at-d.base)/d.step }) {
		t.Errorf("the slot's array still holds connections that left it")
	}
	if got := takeAt(d, at); !slices.Equal(got, append([]*conn{conns[4]}, conns[5:]...)) {
		t.Errorf("handed out %d, want the moved one, then the 5 due", len(got))
	}
	// An ended connection not in the ring changes nothing.
	d.ended(conns[0])
}
