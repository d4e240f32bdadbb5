package gateway

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// signalMessage handles typing and signal: a signal of the connection in
// a room it joined, published on the room's signal subject at once (core
// NATS, nothing stored). An invisible user's signals are dropped: nobody
// sees them in the room.
func (ms *memberships) signalMessage(c *conn, m *protocol.ClientMessage, now int64) {
	if !c.signalLimiter.Allow(now, ms.cfg.SignalRate, ms.cfg.SignalBurst) {
		ms.metrics.msgsIn.WithLabelValues("rate_limited").Inc()
		ms.sendError(c, m.ID, protocol.CodeRateLimited, fmt.Sprintf("too many signals: at most %g per second (--signal-rate)", ms.cfg.SignalRate))
		return
	}
	sig, err := ms.signalOf(c, m)
	if err != nil {
		ms.sendError(c, m.ID, protocol.CodeBadRequest, err.Error())
		return
	}
	if sig == nil {
		return // invisible
	}
	data, err := json.Marshal(sig)
	if err != nil {
		return
	}
	if err := ms.nc.Publish(presence.RoomSignalSubject(sig.Room), data); err != nil {
		ms.log.Warn("publish room signal", "room", sig.Room, "err", err)
	}
}

// signalOf checks a typing or signal message and returns the signal it
// sends; nil, and no error, when its user is invisible.
func (ms *memberships) signalOf(c *conn, m *protocol.ClientMessage) (*presence.RoomSignal, error) {
	sig := &presence.RoomSignal{Room: m.Room, UserID: c.userID, ConnID: c.connID, Gateway: ms.cfg.ID, Signal: protocol.SignalTyping}
	if m.Type == protocol.TypeSignal {
		if !presence.ValidSignal(m.Signal) {
			return nil, fmt.Errorf(`field "signal" must be 1 to %d characters of a-z 0-9 _ -`, presence.MaxSignalLen)
		}
		sig.Signal = m.Signal
		if data := bytes.TrimSpace(m.Data); len(data) > 0 && string(data) != "null" {
			var buf bytes.Buffer
			if err := json.Compact(&buf, data); err != nil {
				return nil, fmt.Errorf(`field "data" must be JSON`)
			}
			if buf.Len() > presence.MaxSignalData {
				return nil, fmt.Errorf(`field "data" is %d bytes: at most %d`, buf.Len(), presence.MaxSignalData)
			}
			sig.Data = buf.Bytes()
		}
	}
	c.rooms.mu.Lock()
	jr, invisible := c.rooms.joined[m.Room], c.rooms.invisible
	c.rooms.mu.Unlock()
	if jr == nil || jr.left {
		return nil, fmt.Errorf("%s needs a room joined: not in room %q", m.Type, m.Room)
	}
	if invisible {
		return nil, nil
	}
	return sig, nil
}

// onSignal takes a signal of the room from NATS, for every local
// connection shown its sender, but the sender itself.
func (r *room) onSignal(msg *nats.Msg) {
	var sig presence.RoomSignal
	if err := json.Unmarshal(msg.Data, &sig); err != nil || sig.Room != r.id || !presence.ValidUserID(sig.UserID) || !presence.ValidSignal(sig.Signal) {
		r.hub.log.Warn("undecodable room signal", "subject", msg.Subject, "err", err)
		return
	}
	var pending *pendingSignal
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, v := range r.locals {
		if c.connID == sig.ConnID || !v.shows(sig.UserID) {
			continue
		}
		if pending == nil {
			var err error
			if pending, err = newPendingSignal(&sig); err != nil {
				r.hub.log.Warn("encode room signal", "room", r.id, "err", err)
				return
			}
		}
		if v.signals == nil {
			v.signals = make(map[signalKey]*pendingSignal)
		}
		v.signals[signalKey{sig.ConnID, sig.Signal}] = pending
		c.roomsChanged()
	}
}

// pendingSignal is a signal waiting for the room_signal frames of the
// sockets shown it, encoded once for all of them.
type pendingSignal struct {
	userID, connID, signal string
	entry                  []byte // its protocol.RoomSignalEntry, as JSON
}

func newPendingSignal(sig *presence.RoomSignal) (*pendingSignal, error) {
	entry, err := json.Marshal(&protocol.RoomSignalEntry{UserID: sig.UserID, ConnID: sig.ConnID,
		Signal: sig.Signal, Data: sig.Data, ExpiresMS: protocol.SignalExpiresMS})
	if err != nil {
		return nil, err
	}
	return &pendingSignal{userID: sig.UserID, connID: sig.ConnID, signal: sig.Signal, entry: entry}, nil
}

// appendSignals appends the room_signal frame of the signals waiting for
// c to dst (as encoding/json writes a protocol.RoomSignal: the room id
// has nothing to escape), and takes them; it reports false, and appends
// nothing, when none waits.
func (r *room) appendSignals(dst []byte, c *conn) ([]byte, bool) {
	var buf [8]*pendingSignal
	sigs := buf[:0]
	r.mu.Lock()
	if v := r.locals[c]; v != nil {
		for _, p := range v.signals {
			sigs = append(sigs, p)
		}
		v.signals = nil
	}
	r.mu.Unlock()
	if len(sigs) == 0 {
		return dst, false
	}
	slices.SortFunc(sigs, func(a, b *pendingSignal) int {
		return cmp.Or(cmp.Compare(a.userID, b.userID), cmp.Compare(a.connID, b.connID), cmp.Compare(a.signal, b.signal))
	})
	dst = append(dst, `{"type":"`+protocol.TypeRoomSignal+`","room":"`...)
	dst = append(dst, r.id...)
	dst = append(dst, `","signals":[`...)
	for i, p := range sigs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, p.entry...)
	}
	return append(dst, "]}"...), true
}
