package gateway

import (
	"context"
	"encoding/json"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// roomOp is what c's room writer does next for one room.
type roomOp uint8

const (
	roomIdle   roomOp = iota // nothing: every key says what it must
	roomPut                  // write the key under the lease now held
	roomDelete               // delete the key
	roomDrop                 // forget a room left, whose key is gone
)

// nextLocked returns the next thing to do for one of the connection's
// rooms, given the lease's epoch and whether it is held. A key is wanted
// while the connection is in the room, has not ended, and its user is not
// invisible; while the lease is lost, wanted keys wait for the next one.
func (rs *connRooms) nextLocked(epoch string, held bool) (string, *joinedRoom, roomOp) {
	for id, jr := range rs.joined {
		want := !jr.left && !rs.ended && !rs.invisible
		switch {
		case want && held && (jr.epoch != epoch || jr.written != jr.gen):
			return id, jr, roomPut
		case !want && jr.epoch != "":
			return id, jr, roomDelete
		case (jr.left || rs.ended) && jr.epoch == "":
			return id, jr, roomDrop
		}
	}
	return "", nil, roomIdle
}

// writeKeys makes c's room keys say what they must, one write at a
// time, until they do. Failed writes are tried again with backoff until
// the gateway stops.
func (ms *memberships) writeKeys(c *conn) {
	backoff := 50 * time.Millisecond
	for {
		epoch, held := ms.keys.lease.epoch()
		c.rooms.mu.Lock()
		id, jr, op := c.rooms.nextLocked(epoch, held)
		switch op {
		case roomIdle:
			c.rooms.running = false
			c.rooms.mu.Unlock()
			return
		case roomDrop:
			delete(c.rooms.joined, id)
			ms.count.Add(-1)
			ms.hub.release(jr.room)
			c.rooms.mu.Unlock()
			continue
		}
		w := roomWrite{
			member: presence.RoomMember{Room: id, Gateway: ms.cfg.ID, Epoch: epoch, UserID: c.userID, ConnID: c.connID},
			value:  presence.RoomValue{Meta: jr.meta, Since: jr.since},
			gen:    jr.gen,
			event:  presence.RoomJoin,
		}
		switch {
		case op == roomDelete:
			w.member.Epoch, w.event = jr.epoch, presence.RoomLeave
		case jr.epoch == epoch:
			w.event = presence.RoomUpdate
		}
		c.rooms.mu.Unlock()

		if err := ms.writeKey(jr.room, &w); err != nil {
			if ms.keys.ctx.Err() != nil {
				c.rooms.mu.Lock()
				c.rooms.running = false
				c.rooms.mu.Unlock()
				return
			}
			ms.log.Warn("write room key", "room", id, "user_id", c.userID, "conn_id", c.connID, "err", err)
			select {
			case <-ms.keys.ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		c.rooms.mu.Lock()
		if op == roomDelete {
			jr.epoch = ""
		} else {
			jr.epoch, jr.written = epoch, w.gen
		}
		close(jr.changed)
		jr.changed = make(chan struct{})
		c.rooms.mu.Unlock()
	}
}

// roomWrite is one write of a room key: the key, its value (for a put),
// the meta change it carries, and the event it makes.
type roomWrite struct {
	member presence.RoomMember
	value  presence.RoomValue
	gen    uint64
	event  string
}

// writeKey makes one write of a room key, publishes its event, and
// applies it to the room's table at once, so that the connection's own
// room_state shows it. A key is written only while the lease it is
// written under is certainly alive, as connection keys are.
func (ms *memberships) writeKey(r *room, w *roomWrite) error {
	ctx, cancel := context.WithTimeout(ms.keys.ctx, requestTimeout)
	defer cancel()
	ev := presence.RoomEvent{Room: w.member.Room, Op: w.event, UserID: w.member.UserID, ConnID: w.member.ConnID,
		Gateway: w.member.Gateway, Epoch: w.member.Epoch}
	var err error
	if w.event == presence.RoomLeave {
		ev.Rev, err = ms.store.DeleteRoomMember(ctx, w.member)
		ms.metrics.kvWrites.WithLabelValues("room_delete").Inc()
	} else {
		if !ms.keys.lease.waitFresh(ctx, w.member.Epoch) {
			return errLeaseLost
		}
		ev.Meta, ev.Since = w.value.Meta, w.value.Since
		ev.Rev, err = ms.store.PutRoomMember(ctx, w.member, w.value)
		ms.metrics.kvWrites.WithLabelValues("room_put").Inc()
	}
	if err != nil {
		ms.metrics.kvErrors.WithLabelValues("room").Inc()
		return err
	}
	if data, err := json.Marshal(&ev); err == nil {
		if err := ms.nc.Publish(presence.RoomSubject(ev.Room), data); err != nil {
			ms.log.Warn("publish room event", "room", ev.Room, "err", err)
		}
	}
	r.apply(&ev)
	return nil
}
