package presence

import (
	"maps"
	"time"
)

// Record is the value of a user's key in StatusBucket. It is written only by
// compare-and-set on the key's revision (Store.UpdateStatus): a writer reads
// the record, changes Chosen or Conns, calls Finish to recompute the derived
// fields, and writes it back only if nobody wrote in between.
//
// The user is online exactly while Conns is not empty.
type Record struct {
	// Chosen is the status the user chose; empty means Online. It survives
	// disconnection: a user who chose busy or invisible is busy or invisible
	// again when they reconnect.
	Chosen Status `json:"chosen,omitempty"`
	// Custom is the custom status the user set, if any; like Chosen, it
	// survives disconnection, until the user clears it or it expires.
	// Writers replace it, never change it in place: clones share it.
	Custom *Custom `json:"custom,omitempty"`
	// Conns are the user's connections, by connection id: every connection
	// whose key in ConnsBucket was created, and whose end (its gateway
	// closing it, the end of its gateway's lease, or for a key of the
	// earlier shape its expiry) was not yet applied.
	Conns map[string]ConnInfo `json:"conns,omitempty"`

	// ended is when the connections the writer took out (RemoveConn) were
	// last seen, in unix ms; it is not stored.
	ended int64

	// The fields below are derived by Finish; writers never set them.

	// Status is the user's true status: offline, online, away, busy or
	// invisible. It is what the user's own devices see.
	Status Status `json:"status"`
	// Public is what everybody else sees: Status, with invisible as offline.
	Public Status `json:"public"`
	// Devices counts the connections that are live (not closing).
	Devices int `json:"devices"`
	// Platforms are the platforms of the live connections that named
	// one, and on which of them the user is active.
	Platforms Platforms `json:"platforms,omitempty"`
	// LastSeen is when Public last changed to or from a visible status, in
	// unix seconds. It does not move while the user is invisible.
	LastSeen int64 `json:"last_seen,omitempty"`
	// Since is when Status last changed, in unix milliseconds.
	Since int64 `json:"since,omitempty"`
	// Versions tell which events the revision calls for.
	Versions
	// Updated is when this revision was written, in unix milliseconds.
	Updated int64 `json:"updated,omitempty"`

	// The stored record also has "uf", which the Store keeps apart (see
	// stored): Record keeps to its size, as writers hold many.
}

// Versions are a status record's version counters, which tell a reader of
// its revisions which events each calls for (see Changes) without the rest
// of the record: decoded alone, they take about half the time of the whole
// record.
type Versions struct {
	// PubVer increases whenever Public or LastSeen changes, so a reader that
	// skipped revisions still knows whether the public view moved.
	PubVer uint64 `json:"pv,omitempty"`
	// SelfVer increases whenever Status or Devices changes.
	SelfVer uint64 `json:"sv,omitempty"`
	// PubSince is, when this revision left the public view as it was, the
	// revision since which it has not moved; 0 when this revision moved it
	// (or the record is new). A fanout that did not handle the revisions
	// between knows from it that this one calls for no public event.
	PubSince uint64 `json:"ps,omitempty"`
}

// ConnInfo is what a Record keeps of one connection.
type ConnInfo struct {
	// Gateway is the id of the gateway holding the socket.
	Gateway string `json:"gw"`
	// Lease is the epoch of the gateway's lease the connection is held
	// under: the end of that lease ends it. Empty for a connection with a
	// key of the earlier shape, which Rev is for.
	Lease string `json:"lease,omitempty"`
	// Device is the label the client gave (web, ios, ...), if any.
	Device string `json:"device,omitempty"`
	// Platform is the platform the client named, if any.
	Platform Platform `json:"platform,omitempty"`
	// Since is when the connection was established, in unix milliseconds.
	Since int64 `json:"since"`
	// Rev is, for a key of the earlier shape, the revision at which the
	// gateway last created it. A removal marker with a higher revision ends
	// this connection; one with a lower revision belongs to an earlier life
	// of the key.
	Rev uint64 `json:"rev,omitempty"`
	// Idle reports that the connection is not in use: the client said idle,
	// or sent no activity for the gateway's away-after period.
	Idle bool `json:"idle,omitempty"`
	// Closing reports that the socket closed cleanly and the connection only
	// lives out the offline grace, so that a quick reconnect does not flap.
	Closing bool `json:"closing,omitempty"`
	// ClosedAt is when the socket closed, in unix milliseconds, once it
	// is Closing: the user's last_seen when it was their last connection.
	ClosedAt int64 `json:"closed_at,omitempty"`
	// Background reports that the client said its app went to the
	// background: the connection is idle, and when its socket closes or
	// dies it lives out its background grace, Closing, instead of the
	// offline grace.
	Background bool `json:"background,omitempty"`
}

// Clone returns a deep copy of r.
func (r *Record) Clone() Record {
	c := *r
	c.Conns = maps.Clone(r.Conns)
	return c
}

// SetConn adds or replaces a connection.
func (r *Record) SetConn(connID string, c ConnInfo) {
	if r.Conns == nil {
		r.Conns = make(map[string]ConnInfo, 1)
	}
	r.Conns[connID] = c
}

// RemoveConn takes a connection out, noting when it was last seen (unix
// ms; zero if unknown), which dates the user's last_seen when it was the
// last one. A connection that closed cleanly carries its own (ClosedAt).
func (r *Record) RemoveConn(connID string, lastSeen int64) {
	if _, ok := r.Conns[connID]; !ok {
		return
	}
	delete(r.Conns, connID)
	r.ended = max(r.ended, lastSeen)
}

// livePlatforms returns the platforms of the live (not closing)
// connections, active where one of them is not idle, and of the
// background ones, open or living out their background grace.
func (r *Record) livePlatforms() Platforms {
	var ps Platforms
	for _, c := range r.Conns {
		if c.Platform != "" && (!c.Closing || c.Background) {
			ps = ps.with(c.Platform, !c.Closing, !c.Idle, c.Background)
		}
	}
	return ps
}

// PublicPlatforms returns the platforms others see: none unless the user
// is visible (online, away or busy; not invisible).
func (r *Record) PublicPlatforms() Platforms {
	if !r.Public.Visible() {
		return 0
	}
	return r.Platforms
}

// True computes the user's true status and live device count from Chosen
// and Conns.
//
// With no connection the user is offline. Otherwise a chosen away, busy or
// invisible wins; a user who chose online (or nothing) is away when every
// connection is idle, and online otherwise. A closing connection keeps the
// idleness it had, so closing the one active tab keeps the user online for
// the grace period rather than flapping to away.
func (r *Record) True() (Status, int) {
	if len(r.Conns) == 0 {
		return Offline, 0
	}
	devices, allIdle := 0, true
	for _, c := range r.Conns {
		if !c.Closing {
			devices++
		}
		if !c.Idle {
			allIdle = false
		}
	}
	switch chosen := r.ChosenStatus(); {
	case chosen != Online:
		return chosen, devices
	case allIdle:
		return Away, devices
	default:
		return Online, devices
	}
}

// ChosenStatus returns Chosen, with empty meaning Online.
func (r *Record) ChosenStatus() Status {
	if r.Chosen == "" {
		return Online
	}
	return r.Chosen
}

// Finish recomputes the derived fields of r, written at now over prev (the
// revision it was read as; the zero Record for a new key).
func (r *Record) Finish(prev *Record, now time.Time) {
	prevPublic := prev.Public
	if prevPublic == "" {
		prevPublic = Offline
	}
	prevStatus := prev.Status
	if prevStatus == "" {
		prevStatus = Offline
	}

	r.Status, r.Devices = r.True()
	r.Public = r.Status.Public()
	r.Platforms = r.livePlatforms()
	r.LastSeen, r.Since = prev.LastSeen, prev.Since
	r.PubVer, r.SelfVer = prev.PubVer, prev.SelfVer

	switch {
	case r.Public != prevPublic:
		r.PubVer++
		if r.Public.Visible() || prevPublic.Visible() {
			r.LastSeen = r.seenAt(prev, now).Unix()
		}
	case r.PublicPlatforms() != prev.PublicPlatforms(), !r.PublicCustom().Equal(prev.PublicCustom()):
		r.PubVer++
	}
	if r.Status != prevStatus || r.Devices != prev.Devices || !r.Custom.Equal(prev.Custom) {
		r.SelfVer++
	}
	if r.Status != prevStatus {
		r.Since = now.UnixMilli()
	}
	r.Updated = now.UnixMilli()
}

// pubSince returns the PubSince of next, written at revision curRev over
// cur, once next is finished.
func pubSince(cur, next *Record, curRev uint64) uint64 {
	switch {
	case cur.Updated == 0 || next.PubVer != cur.PubVer:
		return 0
	case cur.PubSince != 0:
		return cur.PubSince
	}
	return curRev
}

// seenAt returns when the user was last seen, for a write at now over prev
// that changes whether others see them: when the write removes only
// connections whose end is known (closed cleanly: ClosedAt; or noted by
// RemoveConn), the latest of those ends (not the end of the offline grace,
// nor the moment a silent death was found); otherwise now.
func (r *Record) seenAt(prev *Record, now time.Time) time.Time {
	if r.Public.Visible() {
		return now
	}
	latest := r.ended
	for id, c := range prev.Conns {
		if _, ok := r.Conns[id]; ok {
			continue
		}
		switch {
		case c.ClosedAt != 0:
			latest = max(latest, c.ClosedAt)
		case r.ended == 0:
			return now
		}
	}
	if latest == 0 || latest > now.UnixMilli() {
		return now
	}
	return time.UnixMilli(latest)
}

// Presence returns what others see of the user, with LastSeen included
// (the caller removes it where the user's privacy setting says so).
func (r *Record) Presence(userID string) Presence {
	p := Presence{UserID: userID, Status: r.Public, LastSeen: r.LastSeen, Platforms: r.PublicPlatforms(), Custom: r.PublicCustom()}
	if p.Custom.Expired(time.Now()) {
		p.Custom = nil
	}
	if p.Status == "" {
		p.Status = Offline
	}
	return p
}

// ConnRecord is the value of a connection's key in ConnsBucket. The gateway
// holding the socket writes it when the connection starts and when it
// turns idle or active again. (A key of the earlier shape was rewritten
// with a fresh TTL as heartbeats arrived, and carried ActiveAt and AwayAt.)
type ConnRecord struct {
	// Gateway is the id of the gateway holding the socket.
	Gateway string `json:"gw"`
	// Lease is the epoch of the gateway's lease the connection is held
	// under; empty for a key of the earlier shape.
	Lease string `json:"lease,omitempty"`
	// Device is the label the client gave, if any.
	Device string `json:"device,omitempty"`
	// Platform is the platform the client named, if any.
	Platform Platform `json:"platform,omitempty"`
	// Since is when the connection was established, in unix milliseconds.
	Since int64 `json:"since"`
	// ActiveAt is the last activity the gateway knew of when it wrote this
	// revision, in unix milliseconds.
	ActiveAt int64 `json:"active_at,omitempty"`
	// AwayAt is when the connection counts as inactive unless a newer
	// revision moves it, in unix milliseconds; zero while Idle or Closing.
	// The gateway computes it from its away-after setting with enough margin
	// for the activity it has not written yet, so the reaper never turns a
	// user away early.
	AwayAt int64 `json:"away_at,omitempty"`
	// Idle reports that the client said idle.
	Idle bool `json:"idle,omitempty"`
	// Closing reports that the socket closed cleanly; the key now lives only
	// until the offline grace ends.
	Closing bool `json:"closing,omitempty"`
	// Background reports that the client said its app went to the
	// background (see ConnInfo.Background).
	Background bool `json:"background,omitempty"`
}

// LeaseRecord is the value of a gateway's lease in LeasesBucket.
type LeaseRecord struct {
	// Gateway is the gateway's id.
	Gateway string `json:"gw"`
	// Epoch is the lease's epoch: every connection registered under the
	// lease carries it, in its key and in its user's record.
	Epoch string `json:"epoch"`
	// Started is when the gateway took the lease, in unix milliseconds.
	Started int64 `json:"started"`
	// Addr is the gateway's listen address, for operators.
	Addr string `json:"addr,omitempty"`
}

// Presence is the public presence object of the client protocol.
type Presence struct {
	UserID string `json:"user_id"`
	Status Status `json:"status"`
	// LastSeen is in unix seconds; zero means unknown or not visible to
	// this watcher, and is left out of the JSON.
	LastSeen int64 `json:"last_seen,omitempty"`
	// Platforms are where the user is live, when their clients said;
	// none while they are offline or invisible.
	Platforms Platforms `json:"platforms,omitempty"`
	// Custom is the user's custom status; none while they are invisible.
	Custom *Custom `json:"custom_status,omitempty"`
}

// Event is published on EventSubject(UserID) whenever what others see of
// the user changes: by the process that wrote the status revision, right
// after the write, and by the fanout for any revision no writer reported
// publishing (Published).
type Event struct {
	UserID   string `json:"user_id"`
	Status   Status `json:"status"`
	LastSeen int64  `json:"last_seen,omitempty"`
	// Platforms are the user's platforms others see (Record.PublicPlatforms).
	Platforms Platforms `json:"platforms,omitempty"`
	// Custom is the user's custom status others see (Record.PublicCustom).
	Custom *Custom `json:"custom_status,omitempty"`
	// Rev is the StatusBucket revision the event was made from; a gateway
	// drops an event whose Rev is not newer than what it already has.
	Rev uint64 `json:"rev"`
	// At is when the revision was written, in unix milliseconds, so that
	// gateways can measure how long a change took to reach a socket.
	At int64 `json:"at,omitempty"`
}

// Presence returns the event's presence object.
func (e *Event) Presence() Presence {
	return Presence{UserID: e.UserID, Status: e.Status, LastSeen: e.LastSeen, Platforms: e.Platforms, Custom: e.Custom}
}

// SelfEvent is published on SelfSubject(gateway) for each gateway holding
// a connection of UserID, whenever the user's true status or device count
// changes: by the writer of the revision, and by the fanout as Event is.
type SelfEvent struct {
	UserID  string `json:"user_id"`
	Status  Status `json:"status"`
	Devices int    `json:"devices"`
	// Custom is the user's custom status, which their own devices see
	// whatever their status.
	Custom *Custom `json:"custom_status,omitempty"`
	Rev    uint64  `json:"rev"`
}
