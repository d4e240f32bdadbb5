package outbox

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/greendot/greendot/pkg/presence"
)

// Box holds what waits to be written to one socket. It is safe for
// concurrent use. The zero value is an empty box.
type Box struct {
	mu      sync.Mutex
	pending []presence.Presence // the newest change per watched user
	self    Self
	// oldest is when the oldest pending change was written, in unix ms;
	// zero when unknown.
	oldest int64
	// paced is when the socket's pace allows its next write, as the
	// generic cell rate algorithm counts (its theoretical arrival time,
	// unix ns): each write moves it a pace past the later of itself and
	// the write. written is when it was last written (unix ns). The
	// scheduler uses both (see Scheduler).
	paced, written atomic.Int64
	// held counts the holds that keep changes back (see Hold).
	held int32
	// rooms reports that frames of the socket's rooms wait (their
	// contents are the rooms' own, see AddRooms).
	rooms bool
	// queued reports that the box was handed to a scheduler and not taken
	// since.
	queued bool
	// (The fields are in this order so that a Box, and with it a
	// gateway's connection, takes no more memory than it must.)
}

// Self is the socket's own user's state, as the socket last learnt it.
type Self struct {
	Rev    uint64
	Status presence.Status
	// Custom is the user's custom status, if any.
	Custom *presence.Custom
	// Devices is an int32, next to Pending, so that a Self (and with it a
	// connection) takes no more memory for Custom.
	Devices int32
	// Pending reports that it changed since it was last taken.
	Pending bool
}

// Add adds a change, replacing an older change of the same user. at is
// when the change was written (unix ms; zero when unknown), for measuring
// how long it took to reach the socket. Add reports whether the caller
// must hand the box to the scheduler.
func (b *Box) Add(p presence.Presence, at int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	replaced := false
	for i := range b.pending {
		if b.pending[i].UserID == p.UserID {
			b.pending[i] = p
			replaced = true
			break
		}
	}
	if !replaced {
		b.pending = append(b.pending, p)
	}
	if at != 0 && (b.oldest == 0 || at < b.oldest) {
		b.oldest = at
	}
	return b.queueLocked()
}

// Remove drops the change of user that waits, if one does: the socket no
// longer watches user, and must not be written that change any more.
func (b *Box) Remove(user string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.IndexFunc(b.pending, func(p presence.Presence) bool { return p.UserID == user })
	if i < 0 {
		return
	}
	b.pending = slices.Delete(b.pending, i, i+1)
	if len(b.pending) == 0 {
		b.oldest = 0
	}
}

// AddSelf records the socket's own user's state at status revision rev,
// unless the box already has a newer one. It reports whether the caller
// must hand the box to the scheduler.
func (b *Box) AddSelf(rev uint64, status presence.Status, devices int, custom *presence.Custom) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if rev <= b.self.Rev {
		return false
	}
	b.self = Self{Rev: rev, Status: status, Custom: custom, Devices: int32(min(devices, 1<<31-1)), Pending: true}
	return b.queueLocked()
}

// AddRooms records that frames of the socket's rooms wait: what they
// hold is kept by whoever called it, and written when Take says so,
// on the same schedule as the other changes (and held back by Hold like
// them). It reports whether the caller must hand the box to the
// scheduler.
func (b *Box) AddRooms() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rooms = true
	return b.queueLocked()
}

// queueLocked marks the box queued and reports whether it was not yet.
func (b *Box) queueLocked() bool {
	if b.queued || b.held > 0 {
		return false
	}
	b.queued = true
	return true
}

// Take returns what waits and empties the box: the changes, the self
// state, and whether frames of the socket's rooms wait (their contents
// are the rooms' own, see AddRooms). When it returns anything it counts a
// write at now (unix ns) against the socket's pace of one per pace (ns).
// While the box is held it returns nothing.
func (b *Box) Take(now, pace int64) (updates []presence.Presence, self Self, oldest int64, rooms bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queued = false
	if b.held > 0 {
		return nil, Self{}, 0, false
	}
	updates, self, oldest, rooms = b.pending, b.self, b.oldest, b.rooms
	b.pending, b.oldest, b.rooms = nil, 0, false
	b.self.Pending = false
	if len(updates) > 0 || self.Pending || rooms {
		b.paced.Store(max(b.paced.Load(), now) + pace)
		b.written.Store(now)
	}
	return updates, self, oldest, rooms
}

// Hold keeps the box's changes from being taken until Release: a reply
// that must reach the socket before them (presence_init) is being made.
func (b *Box) Hold() {
	b.mu.Lock()
	b.held++
	b.mu.Unlock()
}

// Release ends a Hold. It reports whether the caller must hand the box to
// the scheduler, because changes came while it was held.
func (b *Box) Release() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held--
	if b.held > 0 || len(b.pending) == 0 && !b.self.Pending && !b.rooms {
		return false
	}
	return b.queueLocked()
}

// Len returns how many changes of watched users wait.
func (b *Box) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// Paced returns the socket's paced time and when it was last written
// (unix ns; zero if never written), what the scheduler is given.
func (b *Box) Paced() (paced, written int64) { return b.paced.Load(), b.written.Load() }
