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
func (s *Service) signalMessage(c *conn, m *protocol.ClientMessage, now int64) {
	if !c.signalLimiter.Allow(now, s.cfg.SignalRate, s.cfg.SignalBurst) {
		s.metrics.msgsIn.WithLabelValues("rate_limited").Inc()
		s.sendError(c, m.ID, protocol.CodeRateLimited, fmt.Sprintf("too many signals: at most %g per second (--signal-rate)", s.cfg.SignalRate))
		return
	}
	sig, err := s.signalOf(c, m)
	if err != nil {
		s.sendError(c, m.ID, protocol.CodeBadRequest, err.Error())
		return
	}
	if sig == nil {
		return // invisible
	}
	data, err := json.Marshal(sig)
	if err != nil {
		return
	}
	if err := s.nc.Publish(presence.RoomSignalSubject(sig.Room), data); err != nil {
		s.log.Warn("publish room signal", "room", sig.Room, "err", err)
	}
}

// signalOf checks a typing or signal message and returns the signal it
// sends; nil, and no error, when its user is invisible.
func (s *Service) signalOf(c *conn, m *protocol.ClientMessage) (*presence.RoomSignal, error) {
	sig := &presence.RoomSignal{Room: m.Room, UserID: c.userID, ConnID: c.connID, Gateway: s.cfg.ID, Signal: protocol.SignalTyping}
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
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, v := range r.locals {
		if c.connID == sig.ConnID || !v.shows(sig.UserID) {
			continue
		}
		if v.signals == nil {
			v.signals = make(map[signalKey]*presence.RoomSignal)
		}
		v.signals[signalKey{sig.ConnID, sig.Signal}] = &sig
		c.roomsChanged()
	}
}

// takeSignals returns the room_signal frame of the signals waiting for c,
// or nil when none does.
func (r *room) takeSignals(c *conn) *protocol.RoomSignal {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := r.locals[c]
	if v == nil || len(v.signals) == 0 {
		return nil
	}
	f := &protocol.RoomSignal{Type: protocol.TypeRoomSignal, Room: r.id, Signals: make([]protocol.RoomSignalEntry, 0, len(v.signals))}
	for _, sig := range v.signals {
		f.Signals = append(f.Signals, protocol.RoomSignalEntry{UserID: sig.UserID, ConnID: sig.ConnID,
			Signal: sig.Signal, Data: sig.Data, ExpiresMS: protocol.SignalExpiresMS})
	}
	v.signals = nil
	slices.SortFunc(f.Signals, func(a, b protocol.RoomSignalEntry) int {
		return cmp.Or(cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.ConnID, b.ConnID), cmp.Compare(a.Signal, b.Signal))
	})
	return f
}
