package gateway

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// PendingUpdates returns how many presence changes wait to be written to
// one connection of a user, and false when the gateway holds no such
// connection. Tests use it to see that a socket that does not read holds no
// more than the newest state of each user it watches.
func (s *Service) PendingUpdates(userID, connID string) (int, bool) {
	for _, c := range s.registry.userConns(userID) {
		if c.connID == connID {
			return c.box.Len(), true
		}
	}
	return 0, false
}

// Stalled reports whether a connection of a user has frames waiting for
// its socket to take them (socket.Conn.Stalled).
func (s *Service) Stalled(userID string) bool {
	for _, c := range s.registry.userConns(userID) {
		if c.sock.Stalled() != 0 {
			return true
		}
	}
	return false
}

// Backlog returns the most bytes that wait in the backlog of a
// connection of a user (socket.Conn.Backlog).
func (s *Service) Backlog(userID string) int {
	n := 0
	for _, c := range s.registry.userConns(userID) {
		n = max(n, c.sock.Backlog())
	}
	return n
}

// LastFrame returns when the gateway last read a frame from a connection
// of a user (the latest of them); the zero time when it holds none.
func (s *Service) LastFrame(userID string) time.Time {
	var at int64
	for _, c := range s.registry.userConns(userID) {
		at = max(at, c.lastFrame.Load())
	}
	if at == 0 {
		return time.Time{}
	}
	return time.Unix(0, at)
}

// HoldRegistrations takes n of the MaxRegistering places, as n upgrades
// being registered would, until release is called.
func (s *Service) HoldRegistrations(n int) (release func()) {
	for range n {
		s.regSem <- struct{}{}
	}
	return func() {
		for range n {
			<-s.regSem
		}
	}
}

// AfterDecide has the gateway's authorizer call fn between deciding a
// subscribe and registering it. Call it once the gateway serves.
func (s *Service) AfterDecide(fn func()) { s.authz.ForTest().AfterDecide(fn) }

// MayWatch asks the gateway's authorizer, with its caches, whether watcher
// may watch target. Call it once the gateway serves.
func (s *Service) MayWatch(watcher, target string) (bool, error) {
	d, err := s.authz.Decide(context.Background(), watcher, target)
	return d.Allowed, err
}

// MaxQueued is how many requests of one connection may wait for NATS.
const MaxQueued = maxQueued

// DropIdleCaches drops the writers' copies of records as the gateway does
// once a user has not been written for a while, as if that while had
// passed. It returns how many it dropped.
func (s *Service) DropIdleCaches() int { return s.keys.dropCaches(time.Now().Add(cacheKeep)) }

// RoomConns returns the connections in the member table the gateway keeps
// of a room, sorted; nil when it keeps none (no local member).
func (s *Service) RoomConns(roomID string) []string {
	r := s.roomTable(roomID)
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.members))
}

// NATSClientID returns the server's id of the gateway's NATS connection,
// for a test that cuts it.
func (s *Service) NATSClientID() (uint64, error) { return s.nc.GetClientID() }

// Heartbeats returns how many heartbeats the gateway has read.
func (s *Service) Heartbeats() float64 {
	var m dto.Metric
	if err := s.metrics.heartbeats.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// WithRoomMsgsBuffer returns cfg for a gateway that holds at most n room
// messages waiting to be handed to their rooms.
func WithRoomMsgsBuffer(cfg Config, n int) Config {
	cfg.buffers.roomMsgs = n
	return cfg
}

// LockRoom holds the member table of a room until unlock is called:
// nothing of the room is handed to it meanwhile, nor listed. It returns
// nil when the gateway keeps no table of the room.
//
// First it waits (up to 10 s) until every room message the gateway has
// received, its own events of the joins before included, was taken from
// the buffer they share: one still there when the table is held (an echo
// late on a loaded machine) would be taken later, making room for a
// message the test means NATS to drop.
func (s *Service) LockRoom(roomID string) (unlock func()) {
	r := s.roomTable(roomID)
	if r == nil {
		return nil
	}
	// A flush brings back what the gateway published before it.
	if err := s.nc.Flush(); err == nil {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for deadline := time.Now().Add(10 * time.Second); len(s.rooms.msgs) > 0 && time.Now().Before(deadline); {
			<-tick.C
		}
	}
	r.mu.Lock()
	return r.mu.Unlock
}

// NATSDrops returns how many times NATS dropped messages of a kind (event,
// self, room_event, room_signal) for the gateway.
func (s *Service) NATSDrops(kind string) float64 {
	var m dto.Metric
	if err := s.metrics.natsDrops.WithLabelValues(kind).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// HoldRoomListing has the next listing of a room's keys wait, once it has
// read them, until release is called; read is closed when it waits. Later
// listings do not wait.
func (s *Service) HoldRoomListing() (read <-chan struct{}, release func()) {
	readc, releasec := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	hook := func() {
		if held.CompareAndSwap(false, true) {
			close(readc)
			<-releasec
		}
	}
	s.rooms.afterRead.Store(&hook)
	return readc, sync.OnceFunc(func() { close(releasec) })
}

// ListRoomAgain lists a room's keys again, as the gateway does when the
// room lost an event, and closes done when the listing is over.
func (s *Service) ListRoomAgain(roomID string) (done <-chan struct{}) {
	r := s.roomTable(roomID)
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		if r != nil {
			s.rooms.listAgain(context.Background(), []*room{r})
		}
	}()
	return ch
}

// WithEventsBuffer returns cfg for a gateway that holds at most n
// presence and self events waiting for the dispatcher.
func WithEventsBuffer(cfg Config, n int) Config {
	cfg.buffers.events = n
	return cfg
}

// HoldDispatcher has the gateway's dispatcher wait until release is
// called: events wait meanwhile.
func (s *Service) HoldDispatcher() (release func()) {
	held, done := make(chan struct{}), make(chan struct{})
	s.calls <- func() {
		close(held)
		<-done
	}
	<-held
	return sync.OnceFunc(func() { close(done) })
}

// roomTable returns the gateway's table of a room, nil when it keeps none.
func (s *Service) roomTable(roomID string) *room {
	s.rooms.mu.Lock()
	defer s.rooms.mu.Unlock()
	return s.rooms.rooms[roomID]
}

// RoomLogMinTrim is the length below which a room's change log is never
// trimmed.
const RoomLogMinTrim = minTrim

// RoomLogLen returns how many changes the log of a room's table holds;
// -1 when the gateway keeps no table of the room.
func (s *Service) RoomLogLen(roomID string) int {
	r := s.roomTable(roomID)
	if r == nil {
		return -1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.log.list)
}

// PauseAfterRegister has the next connection of user to the gateway wait
// once it is registered and upgraded and before it is in the gateway's
// registry, until release is called; registered is closed when it waits.
// Later connections do not wait. It is undone, and the connection
// released, when the test ends.
func (s *Service) PauseAfterRegister(tb interface{ Cleanup(func()) }, user string) (registered <-chan struct{}, release func()) {
	regc, relc := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	hook := func(userID string) {
		if userID == user && held.CompareAndSwap(false, true) {
			close(regc)
			<-relc
		}
	}
	s.hooks.afterRegister.Store(&hook)
	release = sync.OnceFunc(func() { close(relc) })
	tb.Cleanup(func() {
		s.hooks.afterRegister.Store(nil)
		release()
	})
	return regc, release
}

// LeaseEpoch returns the epoch of the gateway's lease, and whether the
// gateway holds it.
func (s *Service) LeaseEpoch() (string, bool) { return s.keys.lease.epoch() }

// WatchedBy returns the users one connection of a user watches, sorted;
// nil when the gateway holds no such connection.
func (s *Service) WatchedBy(userID, connID string) []string {
	for _, c := range s.registry.userConns(userID) {
		if c.connID == connID {
			return slices.Sorted(slices.Values(s.hub.WatchedBy(c)))
		}
	}
	return nil
}

// AfterSnapshot has fn run each time a subscribe of user to the gateway
// has read its snapshots, before it settles them; until the test ends.
func (s *Service) AfterSnapshot(tb interface{ Cleanup(func()) }, user string, fn func()) {
	hook := func(userID string) {
		if userID == user {
			fn()
		}
	}
	s.hooks.afterSnapshot.Store(&hook)
	tb.Cleanup(func() { s.hooks.afterSnapshot.Store(nil) })
}

// KnownSelf returns the revision of the newest own state of user the
// gateway knows of, to give a connection of the user's it lists.
func (s *Service) KnownSelf(user string) uint64 {
	s.keys.mu.Lock()
	us := s.keys.users[user]
	s.keys.mu.Unlock()
	if us == nil {
		return 0
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	return us.self.rev
}

// HoldWrites takes the write lock of one connection of a user, as a write
// in progress does, until release is called. It returns nil when the
// gateway holds no such connection.
func (s *Service) HoldWrites(userID, connID string) (release func()) {
	for _, c := range s.registry.userConns(userID) {
		if c.connID == connID {
			c.sock.Lock()
			return sync.OnceFunc(c.sock.Unlock)
		}
	}
	return nil
}

// BeforeOnlineRound has fn run each time the gateway's global presence is
// about to deliver changes to the sockets watching everyone, with the
// users whose changes they are; until the test ends. Call it once the
// gateway serves, under the everyone policy.
func (s *Service) BeforeOnlineRound(tb interface{ Cleanup(func()) }, fn func(users []string)) {
	s.online.beforeRound.Store(&fn)
	tb.Cleanup(func() { s.online.beforeRound.Store(nil) })
}

// WatchedUsers returns how many users the gateway's hub holds: those
// watched by at least one of its sockets.
func (s *Service) WatchedUsers() int { return s.hub.Len() }

// NATSSubscriptions returns how many subscriptions the gateway's NATS
// connection holds.
func (s *Service) NATSSubscriptions() int { return s.nc.NumSubscriptions() }
