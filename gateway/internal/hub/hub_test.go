package hub

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/greendot/greendot/pkg/presence"
)

// sock is a Watcher that records what it is given.
type sock struct {
	mu     sync.Mutex
	got    []presence.Presence
	closed bool
}

func (s *sock) UserID() string { return "watcher" }

func (s *sock) Deliver(p presence.Presence, _ int64) {
	s.mu.Lock()
	s.got = append(s.got, p)
	s.mu.Unlock()
}

func (s *sock) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *sock) take() []presence.Presence {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := s.got
	s.got = nil
	return got
}

// subs counts the subscriptions a hub holds.
type subs struct {
	live map[string]int
}

type sub struct {
	s    *subs
	user string
}

func (x *sub) Unsubscribe() error {
	x.s.live[x.user]--
	if x.s.live[x.user] == 0 {
		delete(x.s.live, x.user)
	}
	return nil
}

func newHub() (*Hub, *subs) {
	s := &subs{live: make(map[string]int)}
	return New(func(user string) (Subscription, error) {
		s.live[user]++
		return &sub{s, user}, nil
	}), s
}

func ev(user string, st presence.Status, rev uint64) *presence.Event {
	return &presence.Event{UserID: user, Status: st, LastSeen: 1000 + int64(rev), Rev: rev}
}

func TestOneSubscriptionPerUser(t *testing.T) {
	h, s := newHub()
	a, b := &sock{}, &sock{}
	if subscribed, err := h.Add(a, []Grant{{User: "bob"}, {User: "carol"}}); err != nil || !subscribed {
		t.Fatalf("Add = %v, %v; want a new subscription", subscribed, err)
	}
	if subscribed, _ := h.Add(b, []Grant{{User: "bob"}}); subscribed {
		t.Error("a second watcher of bob made another subscription")
	}
	if want := map[string]int{"bob": 1, "carol": 1}; !mapsEqual(s.live, want) {
		t.Fatalf("subscriptions %v, want %v", s.live, want)
	}
	h.Remove(a, []string{"bob", "nobody"})
	if s.live["bob"] != 1 || h.Count(a) != 1 {
		t.Errorf("after a stopped watching bob: subscriptions %v, a watches %d", s.live, h.Count(a))
	}
	h.RemoveWatcher(b)
	if _, ok := s.live["bob"]; ok || h.Len() != 1 {
		t.Errorf("after bob's last watcher left: subscriptions %v, %d users watched", s.live, h.Len())
	}
	h.Close()
	if len(s.live) != 0 {
		t.Errorf("after Close: subscriptions %v", s.live)
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestSnapshotAndEvents: events wait while a snapshot is read, a newer
// event replaces the snapshot, and nothing older than what a socket has
// reaches it.
func TestSnapshotAndEvents(t *testing.T) {
	h, _ := newHub()
	a := &sock{}
	if _, err := h.Add(a, []Grant{{User: "bob", LastSeen: true}, {User: "carol"}}); err != nil {
		t.Fatal(err)
	}
	// An event while the snapshot is read is not delivered, but kept.
	if dropped := h.Deliver(ev("bob", presence.Busy, 7)); dropped != 1 {
		t.Errorf("dropped %d while blocked, want 1", dropped)
	}
	snap := h.Settle(a, []Entry{
		{presence.Presence{UserID: "bob", Status: presence.Online, LastSeen: 5}, 5},
		{presence.Presence{UserID: "carol", Status: presence.Away, LastSeen: 9}, 9},
	})
	want := []Entry{
		{presence.Presence{UserID: "bob", Status: presence.Busy, LastSeen: 1007}, 7},
		{presence.Presence{UserID: "carol", Status: presence.Away}, 9},
	}
	if !slices.Equal(snap, want) {
		t.Fatalf("settled snapshot %v, want %v (the newer event, and carol without last_seen)", snap, want)
	}
	if got := a.take(); len(got) != 0 {
		t.Fatalf("delivered before the snapshot: %v", got)
	}
	h.Deliver(ev("bob", presence.Online, 6))  // older than the snapshot
	h.Deliver(ev("carol", presence.Busy, 9))  // the snapshot's revision
	h.Deliver(ev("carol", presence.Busy, 10)) // newer
	h.Deliver(ev("nobody", presence.Busy, 1)) // not watched
	got := a.take()
	if want := []presence.Presence{{UserID: "carol", Status: presence.Busy}}; !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}

func TestRevokedWhileReading(t *testing.T) {
	h, _ := newHub()
	a := &sock{}
	if _, err := h.Add(a, []Grant{{User: "bob"}, {User: "carol"}}); err != nil {
		t.Fatal(err)
	}
	h.Remove(a, []string{"bob"})
	snap := h.Settle(a, []Entry{{presence.Presence{UserID: "bob"}, 1}, {presence.Presence{UserID: "carol"}, 1}})
	if len(snap) != 1 || snap[0].Presence.UserID != "carol" {
		t.Errorf("settled %v, want carol only", snap)
	}
}

func TestClosedWatcherAddsNothing(t *testing.T) {
	h, s := newHub()
	a := &sock{closed: true}
	if _, err := h.Add(a, []Grant{{User: "bob"}}); err != ErrClosed {
		t.Fatalf("Add for a closed socket = %v, want ErrClosed", err)
	}
	if len(s.live) != 0 || h.Len() != 0 {
		t.Errorf("a closed socket left subscriptions: %v", s.live)
	}
}

func TestLastSeenAndResend(t *testing.T) {
	h, _ := newHub()
	a := &sock{}
	if _, err := h.Add(a, []Grant{{User: "bob"}}); err != nil {
		t.Fatal(err)
	}
	// Nothing is resent while the snapshot is read.
	h.Resend(a, presence.Presence{UserID: "bob", Status: presence.Online, LastSeen: 3}, 3)
	h.Settle(a, []Entry{{presence.Presence{UserID: "bob", Status: presence.Online, LastSeen: 3}, 3}})
	if got := a.take(); len(got) != 0 {
		t.Fatalf("resent while blocked: %v", got)
	}
	if h.SetLastSeen(a, "bob", false) {
		t.Error("SetLastSeen to what it was reported a change")
	}
	if !h.SetLastSeen(a, "bob", true) {
		t.Fatal("SetLastSeen to a new value reported no change")
	}
	h.Deliver(ev("bob", presence.Busy, 4))
	h.Resend(a, presence.Presence{UserID: "bob", Status: presence.Online, LastSeen: 3}, 3)
	got := a.take()
	want := []presence.Presence{
		{UserID: "bob", Status: presence.Busy, LastSeen: 1004},
		{UserID: "bob", Status: presence.Busy, LastSeen: 1004}, // the newer event wins over the read
	}
	if !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}

// TestResendNeverGoesBack: a state read before w's snapshot of a newer
// one settled is not what is resent, but the newest the hub knows: w
// would go back to the older one, and the newer one's event, not newer
// than what w has, would never put it right.
func TestResendNeverGoesBack(t *testing.T) {
	h, _ := newHub()
	a := &sock{}
	mustAdd(t, h, a, Grant{User: "bob", LastSeen: true})
	h.Settle(a, []Entry{{presence.Presence{UserID: "bob", Status: presence.Busy, LastSeen: 1005}, 5}})
	if !h.SetLastSeen(a, "bob", false) {
		t.Fatal("SetLastSeen to a new value reported no change")
	}
	h.Resend(a, presence.Presence{UserID: "bob", Status: presence.Online, LastSeen: 1004}, 4)
	if got, want := a.take(), []presence.Presence{{UserID: "bob", Status: presence.Busy}}; !slices.Equal(got, want) {
		t.Fatalf("resent %v, want %v (the settled state, without last_seen now)", got, want)
	}
	h.Deliver(ev("bob", presence.Busy, 5)) // what a has
	h.Deliver(ev("bob", presence.Away, 6))
	if got, want := a.take(), []presence.Presence{{UserID: "bob", Status: presence.Away}}; !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
	// A read newer than anything the hub has seen is resent, and is the
	// newest it knows from then on.
	h.Resend(a, presence.Presence{UserID: "bob", Status: presence.Online, LastSeen: 1007}, 7)
	h.Deliver(ev("bob", presence.Online, 7))
	if got, want := a.take(), []presence.Presence{{UserID: "bob", Status: presence.Online}}; !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v (the read, once)", got, want)
	}
}

func TestSharedSubscription(t *testing.T) {
	h := New(nil)
	a := &sock{}
	if subscribed, err := h.Add(a, []Grant{{User: "bob"}}); err != nil || subscribed {
		t.Fatalf("Add without a subscribe function = %v, %v; want no subscription", subscribed, err)
	}
	h.Settle(a, []Entry{{presence.Presence{UserID: "bob"}, 1}})
	h.Deliver(ev("bob", presence.Busy, 2))
	if got := a.take(); len(got) != 1 {
		t.Errorf("delivered %v, want bob's change", got)
	}
	h.Close()
}

// mustAdd registers w's grants, failing the test if it cannot.
func mustAdd(t *testing.T, h *Hub, w Watcher, grants ...Grant) {
	t.Helper()
	if _, err := h.Add(w, grants); err != nil {
		t.Fatal(err)
	}
}

// TestCancelChangesNothing: a subscribe whose snapshots could not be read
// leaves the socket's subscriptions as they were. The ones it made end;
// the ones it had go on from the revision it has, and the change that
// came while they were blocked is delivered, not lost.
func TestCancelChangesNothing(t *testing.T) {
	h, s := newHub()
	a := &sock{}
	mustAdd(t, h, a, Grant{User: "bob", LastSeen: true})
	h.Settle(a, []Entry{{presence.Presence{UserID: "bob", Status: presence.Online}, 5}})
	mustAdd(t, h, a, Grant{User: "bob", LastSeen: true}, Grant{User: "carol"})
	h.Deliver(ev("bob", presence.Busy, 7)) // waits: bob is blocked
	h.Cancel(a, []string{"bob", "carol", "nobody"})
	if want := map[string]int{"bob": 1}; !mapsEqual(s.live, want) || h.Count(a) != 1 || !h.Watching(a, "bob") {
		t.Fatalf("after Cancel: subscriptions %v, a watches %d; want bob only", s.live, h.Count(a))
	}
	if got, want := a.take(), []presence.Presence{{UserID: "bob", Status: presence.Busy, LastSeen: 1007}}; !slices.Equal(got, want) {
		t.Fatalf("delivered on Cancel %v, want %v (the change that waited)", got, want)
	}
	h.Deliver(ev("bob", presence.Away, 7)) // what a has
	h.Deliver(ev("bob", presence.Away, 8))
	if got, want := a.take(), []presence.Presence{{UserID: "bob", Status: presence.Away, LastSeen: 1008}}; !slices.Equal(got, want) {
		t.Errorf("delivered after Cancel %v, want %v", got, want)
	}
	// Nothing waited: nothing is delivered, and the watch is not blocked.
	mustAdd(t, h, a, Grant{User: "bob", LastSeen: true})
	h.Cancel(a, []string{"bob"})
	h.Resend(a, presence.Presence{UserID: "bob", Status: presence.Away, LastSeen: 1008}, 8)
	if got := a.take(); len(got) != 1 {
		t.Errorf("after a Cancel with nothing new: delivered %v, want the resent state only", got)
	}
}

// TestCancelLeavesWatchesAlone: Cancel touches only what Add blocked: not
// a watch Add never reached, and not one revoked meanwhile, which stays
// ended.
func TestCancelLeavesWatchesAlone(t *testing.T) {
	h, s := newHub()
	a := &sock{}
	mustAdd(t, h, a, Grant{User: "bob"}, Grant{User: "carol"})
	h.Settle(a, []Entry{{presence.Presence{UserID: "bob"}, 1}, {presence.Presence{UserID: "carol"}, 1}})
	mustAdd(t, h, a, Grant{User: "carol"}, Grant{User: "dave"})
	h.Remove(a, []string{"carol"}) // revoked while its snapshot is read
	h.Cancel(a, []string{"bob", "carol", "dave"})
	if want := map[string]int{"bob": 1}; !mapsEqual(s.live, want) || h.Count(a) != 1 {
		t.Fatalf("after Cancel: subscriptions %v, a watches %d; want bob only", s.live, h.Count(a))
	}
	h.Deliver(ev("bob", presence.Busy, 2))
	if got := a.take(); len(got) != 1 {
		t.Errorf("delivered %v, want bob's change", got)
	}
}

// TestFailedAddChangesNothing: when a subscription cannot be made, Add
// fails with nothing registered, nothing subscribed, and no watch the
// socket had left blocked.
func TestFailedAddChangesNothing(t *testing.T) {
	s := &subs{live: make(map[string]int)}
	failing := errors.New("no subscription")
	h := New(func(user string) (Subscription, error) {
		if user == "carol" {
			return nil, failing
		}
		s.live[user]++
		return &sub{s, user}, nil
	})
	a := &sock{}
	mustAdd(t, h, a, Grant{User: "bob"})
	h.Settle(a, []Entry{{presence.Presence{UserID: "bob"}, 1}})
	if _, err := h.Add(a, []Grant{{User: "dave"}, {User: "bob"}, {User: "carol"}}); err != failing {
		t.Fatalf("Add = %v, want the subscription's error", err)
	}
	if want := map[string]int{"bob": 1}; !mapsEqual(s.live, want) || h.Len() != 1 || h.Count(a) != 1 {
		t.Fatalf("after a failed Add: subscriptions %v, %d users watched, a watches %d; want bob only", s.live, h.Len(), h.Count(a))
	}
	h.Deliver(ev("bob", presence.Busy, 2))
	if got := a.take(); len(got) != 1 {
		t.Errorf("delivered %v, want bob's change: his watch was left blocked", got)
	}
}
