package reaper

import (
	"slices"
	"testing"
	"time"
)

func at(ms int64) time.Time { return time.UnixMilli(ms) }

func TestTimersDueInOrder(t *testing.T) {
	tm := newTimers()
	tm.set("c", 300)
	tm.set("a", 100)
	tm.set("b", 200)
	if n := tm.len(); n != 3 {
		t.Fatalf("len = %d, want 3", n)
	}

	keys, next := tm.due(at(50))
	if len(keys) != 0 || next != 50*time.Millisecond {
		t.Errorf("due(50) = %v, %v; want none, next in 50ms", keys, next)
	}
	keys, next = tm.due(at(200))
	if !slices.Equal(keys, []string{"a", "b"}) || next != 100*time.Millisecond {
		t.Errorf("due(200) = %v, %v; want [a b], next in 100ms", keys, next)
	}
	keys, next = tm.due(at(1000))
	if !slices.Equal(keys, []string{"c"}) || next != -1 {
		t.Errorf("due(1000) = %v, %v; want [c], no next", keys, next)
	}
	if n := tm.len(); n != 0 {
		t.Errorf("len = %d after every deadline passed, want 0", n)
	}
	// A key is returned once per deadline.
	if keys, _ := tm.due(at(2000)); len(keys) != 0 {
		t.Errorf("due again = %v, want none", keys)
	}
}

func TestTimersMove(t *testing.T) {
	tm := newTimers()
	// Later: the old heap entry pops and is pushed again at the new time.
	tm.set("k", 100)
	tm.set("k", 500)
	if keys, next := tm.due(at(200)); len(keys) != 0 || next != 300*time.Millisecond {
		t.Errorf("after moving later: due(200) = %v, %v; want none, next in 300ms", keys, next)
	}
	if keys, _ := tm.due(at(500)); !slices.Equal(keys, []string{"k"}) {
		t.Errorf("due(500) = %v, want [k]", keys)
	}

	// Earlier: a new entry comes first; the old one stays in the heap (a
	// spurious wake-up at most) and is dropped as stale when it pops.
	tm.set("k", 900)
	tm.set("k", 600)
	if keys, _ := tm.due(at(700)); !slices.Equal(keys, []string{"k"}) {
		t.Errorf("after moving earlier: due(700) = %v, want [k]", keys)
	}
	if keys, _ := tm.due(at(1000)); len(keys) != 0 {
		t.Errorf("the stale entry fired: %v", keys)
	}

	// Back and forth many times: still one firing, at the last deadline.
	for i := range 100 {
		tm.set("x", int64(2000+(i%7)*100))
	}
	tm.set("x", 2500)
	var fired []int64
	for ms := int64(1900); ms <= 3000; ms += 50 {
		if keys, _ := tm.due(at(ms)); len(keys) > 0 {
			fired = append(fired, ms)
		}
	}
	if !slices.Equal(fired, []int64{2500}) {
		t.Errorf("x fired at %v, want once at 2500", fired)
	}
}

func TestTimersClear(t *testing.T) {
	tm := newTimers()
	tm.set("a", 100)
	tm.set("b", 100)
	tm.clear("a")
	tm.clear("nope")
	if keys, _ := tm.due(at(100)); !slices.Equal(keys, []string{"b"}) {
		t.Errorf("due = %v, want [b]", keys)
	}
	// Set again after clearing: it fires at the new deadline.
	tm.set("a", 300)
	tm.clear("a")
	tm.set("a", 400)
	keys, _ := tm.due(at(350))
	if len(keys) != 0 {
		t.Errorf("due(350) = %v, want none", keys)
	}
	if keys, _ := tm.due(at(400)); !slices.Equal(keys, []string{"a"}) {
		t.Errorf("due(400) = %v, want [a]", keys)
	}
}

func TestTimersWake(t *testing.T) {
	tm := newTimers()
	woke := func() bool {
		select {
		case <-tm.wake:
			return true
		default:
			return false
		}
	}
	tm.set("a", 500)
	if !woke() {
		t.Error("the first deadline did not wake the loop")
	}
	tm.set("b", 900)
	if woke() {
		t.Error("a later deadline woke the loop")
	}
	tm.set("c", 100)
	if !woke() {
		t.Error("an earlier deadline did not wake the loop")
	}
	tm.set("c", 50)
	tm.set("d", 40)
	if !woke() || woke() {
		t.Error("several earlier deadlines: want exactly one pending wake-up")
	}
}
