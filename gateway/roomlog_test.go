package gateway

import (
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// ids returns the connection ids of changes.
func ids(chs []roomChange) []string {
	out := make([]string, len(chs))
	for i, ch := range chs {
		out[i] = ch.connID
	}
	return out
}

func change(n int) roomChange { return roomChange{connID: strconv.Itoa(n), userID: "u"} }

// TestChangeLog: readers get every change after the one they saw, also
// across trims, and what every reader has taken is dropped.
func TestChangeLog(t *testing.T) {
	var l changeLog
	l.skip() // change 1, with no reader
	l.skip() // change 2
	if got := l.since(l.seq); len(got) != 0 || l.seq != 2 {
		t.Fatalf("after two skipped changes: since = %v, seq = %d; want nothing and 2", ids(got), l.seq)
	}
	slow, fast := l.seq, l.seq
	for n := 3; n <= 1000; n++ {
		l.add(change(n))
		if got := l.since(fast); len(got) != 1 || got[0].connID != strconv.Itoa(n) {
			t.Fatalf("change %d: the reader up to date gets %v", n, ids(got))
		}
		fast = l.seq
		if n == 100 {
			slow = l.seq // the slow reader reads once, here
		}
		if l.due() {
			l.trim(min(slow, fast))
		}
	}
	got := l.since(slow)
	if len(got) != 900 || got[0].connID != "101" || got[899].connID != "1000" {
		t.Fatalf("the slow reader gets %d changes, %s to %s; want 900, 101 to 1000", len(got), got[0].connID, got[len(got)-1].connID)
	}
	if len(l.list) != 900 {
		t.Errorf("the log keeps %d changes; want the 900 the slow reader has not seen", len(l.list))
	}
	// Once the slow reader has caught up, the next trim drops everything.
	for n := 1001; !l.due(); n++ {
		l.add(change(n))
		fast = l.seq
	}
	slow = l.seq
	l.trim(min(slow, fast))
	if len(l.list) != 0 || l.trimAt != 0 || len(l.since(l.seq)) != 0 {
		t.Errorf("after every reader caught up: %d changes kept, next trim at %d; want none and the minimum", len(l.list), l.trimAt)
	}
	l.add(change(5000))
	if got := l.since(fast); len(got) != 1 || got[0].connID != "5000" {
		t.Errorf("after the trim: since = %v, want [5000]", ids(got))
	}
	// A reader's seen may not be older than the log: a trim asked to drop
	// beyond the newest change drops only what there is.
	l.trim(l.seq + 10)
	if len(l.list) != 0 || len(l.since(l.seq)) != 0 {
		t.Errorf("trim beyond the newest: %d changes kept", len(l.list))
	}
}

// TestFirstUsers: the selection of a room's first users is the head of
// its sorted ids, for rooms smaller and larger than the limit, ids in any
// order.
func TestFirstUsers(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, 5, 100, 101, 1000, 10000} {
		users := make(map[string]int, size)
		for len(users) < size {
			users["u"+strconv.Itoa(rng.IntN(10*size))] = 1
		}
		sorted := slices.Sorted(maps.Keys(users))
		for _, n := range []int{0, 1, 10, 100, 20000} {
			want := sorted[:min(n, size)]
			if got := firstUsers(users, n); !slices.Equal(got, want) {
				t.Errorf("%d users, first %d: got %d ids %.5v, want %d ids %.5v", size, n, len(got), got, len(want), want)
			}
		}
	}
}
