package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/pkg/presence"
)

// roomHub holds, for every room with a local member (a connection of
// this gateway that joined it), the room's member table: every
// connection in the room, on any gateway. A table starts from a listing
// of the room's keys, made after subscribing to the room's events (which
// wait meanwhile), and follows the events; it is listed again after a
// NATS reconnect, when events may have been missed. It is safe for
// concurrent use.
type roomHub struct {
	nc      *nats.Conn
	log     *slog.Logger
	metrics *gatewayMetrics
	// store is set once the buckets are open (memberships.opened),
	// before any room is.
	store *presence.Store

	mu    sync.Mutex
	rooms map[string]*room

	// msgs carries every room's events and signals from NATS to run,
	// which hands each to its room, in order: one goroutine for all the
	// rooms, where a subscription with a handler of its own would start
	// one per subscription, and wake it for each message. NATS drops what
	// does not fit (a slow consumer): a room that lost an event is listed
	// again (see dropped, and Service.catchDrops).
	msgs chan *nats.Msg
	// subs are the rooms' subscriptions, for run to find a message's
	// room. subMu is held while one is made, so that run cannot take a
	// message of it before it is here.
	subMu sync.RWMutex
	subs  map[*nats.Subscription]roomSub
	// lost holds the rooms' subscriptions that lost events (see
	// lostSubs); relistLost lists their rooms again.
	lost *lostSubs[*room]

	// afterRead, when set (by tests), runs in each listing once the keys
	// are read.
	afterRead atomic.Pointer[func()]
}

// roomSub is what a room subscription carries: a room's events, or its
// signals.
type roomSub struct {
	r      *room
	signal bool
}

// newRoomHub returns a hub with no rooms, whose run takes buffer
// messages at most before NATS drops them; its store is set once the
// buckets are open.
func newRoomHub(nc *nats.Conn, log *slog.Logger, m *gatewayMetrics, buffer int) *roomHub {
	return &roomHub{nc: nc, log: log, metrics: m, rooms: make(map[string]*room),
		msgs: make(chan *nats.Msg, buffer), subs: make(map[*nats.Subscription]roomSub),
		lost: newLostSubs[*room]()}
}

// run hands the rooms' messages to their rooms until ctx is canceled.
func (h *roomHub) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-h.msgs:
			h.subMu.RLock()
			rs, ok := h.subs[msg.Sub]
			h.subMu.RUnlock()
			switch {
			case !ok:
				// Its room was released: no local connection is in it.
			case rs.signal:
				rs.r.onSignal(msg)
			default:
				rs.r.onEvent(msg)
			}
		}
	}
}

// subscribe subscribes r to its events, or its signals, for run.
func (h *roomHub) subscribe(r *room, subject string, signal bool) (*nats.Subscription, error) {
	h.subMu.Lock()
	defer h.subMu.Unlock()
	sub, err := h.nc.ChanSubscribe(subject, h.msgs)
	if err != nil {
		return nil, fmt.Errorf("subscribe to room %q: %w", r.id, err)
	}
	h.subs[sub] = roomSub{r: r, signal: signal}
	return sub, nil
}

// unsubscribe ends a room subscription; run drops what of it still waits.
func (h *roomHub) unsubscribe(sub *nats.Subscription) {
	h.subMu.Lock()
	delete(h.subs, sub)
	h.subMu.Unlock()
	_ = sub.Unsubscribe()
}

// dropped notes that NATS dropped messages of sub, and reports whether
// sub is a room's. A room that lost events is listed again; lost signals
// are only counted (they expire within seconds anyway).
func (h *roomHub) dropped(sub *nats.Subscription) bool {
	h.subMu.RLock()
	rs, ok := h.subs[sub]
	h.subMu.RUnlock()
	if !ok {
		return false
	}
	if rs.signal {
		h.metrics.natsDrops.WithLabelValues("room_signal").Inc()
		return true
	}
	h.metrics.natsDrops.WithLabelValues("room_event").Inc()
	h.log.Warn("room events dropped, the gateway fell behind: listing the room again", "room", rs.r.id)
	h.lost.note(sub, rs.r)
	return true
}

// relistLost lists again the rooms that lost events, until ctx is
// canceled. A listing that fails is tried again until it succeeds.
func (h *roomHub) relistLost(ctx context.Context) {
	h.lost.each(ctx, func(rooms []*room) { h.listAgain(ctx, rooms) })
}

// acquire returns the table of a room for a local connection joining it,
// made (subscribed and listed) if it is the first; release gives it back.
func (h *roomHub) acquire(ctx context.Context, id string) (*room, error) {
	h.mu.Lock()
	r := h.rooms[id]
	first := r == nil
	if first {
		r = &room{id: id, hub: h, ready: make(chan struct{}), members: make(map[string]*roomMember),
			users: make(map[string]int), locals: make(map[*conn]*roomView)}
		h.rooms[id] = r
	}
	r.refs++
	h.mu.Unlock()
	if first {
		r.err = r.open(ctx)
		close(r.ready)
	}
	select {
	case <-r.ready:
	case <-ctx.Done():
		h.release(r)
		return nil, ctx.Err()
	}
	if r.err != nil {
		h.release(r)
		return nil, r.err
	}
	return r, nil
}

// release gives back a room acquired; the last one out unsubscribes.
func (h *roomHub) release(r *room) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.refs--
	if r.refs > 0 {
		return
	}
	if h.rooms[r.id] == r {
		delete(h.rooms, r.id)
	}
	for _, sub := range []*nats.Subscription{r.sub, r.sigSub} {
		if sub != nil {
			h.unsubscribe(sub)
		}
	}
}

// all returns every room with local members.
func (h *roomHub) all() []*room {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*room, 0, len(h.rooms))
	for _, r := range h.rooms {
		out = append(out, r)
	}
	return out
}

// len returns how many rooms have local members.
func (h *roomHub) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.rooms)
}

// onLeaseEnded takes a RoomLeaseEnded from NATS: every room drops the
// members held under that lease.
func (h *roomHub) onLeaseEnded(msg *nats.Msg) {
	var ev presence.RoomLeaseEnded
	if err := json.Unmarshal(msg.Data, &ev); err != nil || ev.Gateway == "" || ev.Epoch == "" {
		h.log.Warn("undecodable lease end", "subject", msg.Subject, "err", err)
		return
	}
	for _, r := range h.all() {
		r.leaseEnded(ev.Gateway, ev.Epoch)
	}
}

// relist lists every room again, after NATS came back: events may have
// been missed meanwhile.
func (h *roomHub) relist(ctx context.Context) { h.listAgain(ctx, h.all()) }

// listAgain lists again those of rooms still in use. A listing that fails
// is tried again until it succeeds.
func (h *roomHub) listAgain(ctx context.Context, rooms []*room) {
	retryEach(ctx, rooms, func(r *room) error {
		select {
		case <-r.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
		if r.err != nil || !h.holds(r) {
			return nil
		}
		return r.list(ctx)
	}, func(r *room, err error, pause time.Duration) {
		h.log.Warn("list room again", "room", r.id, "err", err, "retry_in", pause)
	})
}

// holds reports whether r is the table of its room, still in use.
func (h *roomHub) holds(r *room) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rooms[r.id] == r
}
