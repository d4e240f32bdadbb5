package presence

import "encoding/json"

// Changes returns the events a status revision of userID calls for: the
// public Event when what others see of the user changed from prev to next,
// and the SelfEvent when the user's true status or device count did, with
// the gateways it goes to. next is the record written at revision rev
// over prev (the zero Record for a new key, or the record last published);
// a nil next means the record was deleted, which others see as offline.
//
// It is the one place that decides what a revision means to others, with
// Moved, which it decides by: the process that writes a revision
// publishes what it returns at once, and the fanout, which makes sure
// every revision was published, asks Moved of every revision's versions
// and this of those whose events it publishes.
func Changes(userID string, prev, next *Record, rev uint64) (pub *Event, self *SelfEvent, gateways []string) {
	var was, is *Versions
	if prev.Updated != 0 {
		was = &prev.Versions
	}
	if next != nil {
		is = &next.Versions
	}
	pubMoved, selfMoved := Moved(was, is)
	if next == nil {
		return &Event{UserID: userID, Status: Offline, Rev: rev}, nil, nil
	}
	if pubMoved {
		pub = &Event{UserID: userID, Status: next.Public, LastSeen: next.LastSeen, Platforms: next.PublicPlatforms(), Custom: next.PublicCustom(), Rev: rev, At: next.Updated}
		if pub.Status == "" {
			pub.Status = Offline
		}
	}
	if selfMoved {
		if gateways = Gateways(next); len(gateways) > 0 {
			self = &SelfEvent{UserID: userID, Status: next.Status, Devices: next.Devices, Custom: next.Custom, Rev: rev}
		}
	}
	return pub, self, gateways
}

// Moved reports which events a revision calls for, from the versions of
// its record (next; nil when it was deleted) and of the record before it
// (prev; nil when unknown, or for a new key): a public event when the
// public view moved, or the record was deleted, and self events when the
// user's true status or device count moved. PubVer and SelfVer move with
// every change, and a record made again after a deletion starts them
// over, so any difference is a change.
func Moved(prev, next *Versions) (pub, self bool) {
	switch {
	case next == nil:
		return true, false
	case prev == nil:
		return true, true
	}
	return next.PubVer != prev.PubVer, next.SelfVer != prev.SelfVer
}

// Gateways returns the distinct gateways holding a live (not closing)
// connection of the record's user: where its SelfEvents go.
func Gateways(rec *Record) []string {
	var out []string
	for _, c := range rec.Conns {
		if c.Closing || c.Gateway == "" {
			continue
		}
		dup := false
		for _, g := range out {
			if g == c.Gateway {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, c.Gateway)
		}
	}
	return out
}

// EncodeEvent returns the JSON of an Event, as published.
func EncodeEvent(ev *Event) ([]byte, error) { return json.Marshal(ev) }

// EncodeSelfEvent returns the JSON of a SelfEvent, as published.
func EncodeSelfEvent(ev *SelfEvent) ([]byte, error) { return json.Marshal(ev) }
