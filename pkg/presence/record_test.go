package presence_test

import (
	"errors"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

func conns(cs ...presence.ConnInfo) map[string]presence.ConnInfo {
	m := make(map[string]presence.ConnInfo, len(cs))
	for i, c := range cs {
		m[string(rune('a'+i))] = c
	}
	return m
}

var (
	active  = presence.ConnInfo{Gateway: "g1"}
	idle    = presence.ConnInfo{Gateway: "g1", Idle: true}
	closing = presence.ConnInfo{Gateway: "g1", Closing: true}
	// closingIdle closed cleanly after it had gone idle.
	closingIdle = presence.ConnInfo{Gateway: "g1", Closing: true, Idle: true}
)

func TestRecordTrue(t *testing.T) {
	tests := []struct {
		name    string
		chosen  presence.Status
		conns   map[string]presence.ConnInfo
		status  presence.Status
		devices int
	}{
		{"no connection", "", nil, presence.Offline, 0},
		{"no connection, chose busy", presence.Busy, nil, presence.Offline, 0},
		{"no connection, chose invisible", presence.Invisible, nil, presence.Offline, 0},
		{"one active", "", conns(active), presence.Online, 1},
		{"chose online explicitly", presence.Online, conns(active), presence.Online, 1},
		{"two active", "", conns(active, active), presence.Online, 2},
		{"every connection idle", "", conns(idle, idle), presence.Away, 2},
		{"one idle, one active", "", conns(idle, active), presence.Online, 2},
		{"chose away while active", presence.Away, conns(active), presence.Away, 1},
		{"chose busy while idle", presence.Busy, conns(idle), presence.Busy, 1},
		{"chose invisible", presence.Invisible, conns(active, idle), presence.Invisible, 2},
		{"closing only: online through the grace", "", conns(closing), presence.Online, 0},
		{"closing keeps its activity", "", conns(closing, idle), presence.Online, 1},
		{"closing idle and idle", "", conns(closingIdle, idle), presence.Away, 1},
		{"closing only, chose busy", presence.Busy, conns(closing), presence.Busy, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := presence.Record{Chosen: tt.chosen, Conns: tt.conns}
			status, devices := r.True()
			if status != tt.status || devices != tt.devices {
				t.Errorf("got %s with %d devices, want %s with %d", status, devices, tt.status, tt.devices)
			}
		})
	}
}

func TestRecordFinish(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	t1 := t0.Add(90 * time.Second)

	tests := []struct {
		name string
		prev presence.Record // already finished, or zero for a new key
		next presence.Record // Chosen and Conns; the rest is derived
		// want holds the derived fields.
		want presence.Record
	}{
		{
			name: "first connection",
			next: presence.Record{Conns: conns(active)},
			want: presence.Record{Status: presence.Online, Public: presence.Online, Devices: 1,
				LastSeen: t1.Unix(), Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 1, SelfVer: 1}},
		},
		{
			name: "a second device: only the user's own view moves",
			prev: finished(presence.Record{Conns: conns(active)}, t0),
			next: presence.Record{Conns: conns(active, active)},
			want: presence.Record{Status: presence.Online, Public: presence.Online, Devices: 2,
				LastSeen: t0.Unix(), Since: t0.UnixMilli(), Versions: presence.Versions{PubVer: 1, SelfVer: 2}},
		},
		{
			name: "busy",
			prev: finished(presence.Record{Conns: conns(active)}, t0),
			next: presence.Record{Chosen: presence.Busy, Conns: conns(active)},
			want: presence.Record{Status: presence.Busy, Public: presence.Busy, Devices: 1,
				LastSeen: t1.Unix(), Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 2, SelfVer: 2}},
		},
		{
			name: "going invisible looks like going offline",
			prev: finished(presence.Record{Conns: conns(active)}, t0),
			next: presence.Record{Chosen: presence.Invisible, Conns: conns(active)},
			want: presence.Record{Status: presence.Invisible, Public: presence.Offline, Devices: 1,
				LastSeen: t1.Unix(), Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 2, SelfVer: 2}},
		},
		{
			name: "an invisible user's devices change: nothing public moves",
			prev: finished(presence.Record{Chosen: presence.Invisible, Conns: conns(active)}, t0),
			next: presence.Record{Chosen: presence.Invisible, Conns: conns(active, active)},
			want: presence.Record{Status: presence.Invisible, Public: presence.Offline, Devices: 2,
				LastSeen: 0, Since: t0.UnixMilli(), Versions: presence.Versions{PubVer: 0, SelfVer: 2}},
		},
		{
			name: "an invisible user disconnects: last_seen does not move",
			prev: finished(presence.Record{Chosen: presence.Invisible, Conns: conns(active)}, t0),
			next: presence.Record{Chosen: presence.Invisible},
			want: presence.Record{Status: presence.Offline, Public: presence.Offline, Devices: 0,
				LastSeen: 0, Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 0, SelfVer: 2}},
		},
		{
			name: "every connection idle: away",
			prev: finished(presence.Record{Conns: conns(active)}, t0),
			next: presence.Record{Conns: conns(idle)},
			want: presence.Record{Status: presence.Away, Public: presence.Away, Devices: 1,
				LastSeen: t1.Unix(), Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 2, SelfVer: 2}},
		},
		{
			name: "clean close: online through the grace, one device less",
			prev: finished(presence.Record{Conns: conns(active)}, t0),
			next: presence.Record{Conns: conns(closing)},
			want: presence.Record{Status: presence.Online, Public: presence.Online, Devices: 0,
				LastSeen: t0.Unix(), Since: t0.UnixMilli(), Versions: presence.Versions{PubVer: 1, SelfVer: 2}},
		},
		{
			name: "last connection gone",
			prev: finished(presence.Record{Conns: conns(closing)}, t0),
			next: presence.Record{},
			want: presence.Record{Status: presence.Offline, Public: presence.Offline, Devices: 0,
				LastSeen: t1.Unix(), Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 2, SelfVer: 2}},
		},
		{
			name: "last connection gone after the grace: last seen at its close",
			prev: finished(presence.Record{Conns: conns(closedAt(t0.Add(30 * time.Second)))}, t0),
			next: presence.Record{},
			want: presence.Record{Status: presence.Offline, Public: presence.Offline, Devices: 0,
				LastSeen: t0.Add(30 * time.Second).Unix(), Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 2, SelfVer: 2}},
		},
		{
			name: "two closed connections gone: the later close",
			prev: finished(presence.Record{Conns: conns(closedAt(t0.Add(10*time.Second)), closedAt(t0.Add(20*time.Second)))}, t0),
			next: presence.Record{},
			want: presence.Record{Status: presence.Offline, Public: presence.Offline, Devices: 0,
				LastSeen: t0.Add(20 * time.Second).Unix(), Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 2, SelfVer: 2}},
		},
		{
			name: "a closed and a dead connection gone: now",
			prev: finished(presence.Record{Conns: conns(closedAt(t0.Add(10*time.Second)), active)}, t0),
			next: presence.Record{},
			want: presence.Record{Status: presence.Offline, Public: presence.Offline, Devices: 0,
				LastSeen: t1.Unix(), Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 2, SelfVer: 2}},
		},
		{
			name: "nothing changes: only Updated moves",
			prev: finished(presence.Record{Chosen: presence.Busy, Conns: conns(active)}, t0),
			next: presence.Record{Chosen: presence.Busy, Conns: conns(active)},
			want: presence.Record{Status: presence.Busy, Public: presence.Busy, Devices: 1,
				LastSeen: t0.Unix(), Since: t0.UnixMilli(), Versions: presence.Versions{PubVer: 1, SelfVer: 1}},
		},
		{
			name: "chosen status survives disconnection",
			prev: finished(presence.Record{Chosen: presence.Busy}, t0),
			next: presence.Record{Chosen: presence.Busy, Conns: conns(active)},
			want: presence.Record{Status: presence.Busy, Public: presence.Busy, Devices: 1,
				LastSeen: t1.Unix(), Since: t1.UnixMilli(), Versions: presence.Versions{PubVer: 1, SelfVer: 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := tt.next.Clone()
			next.Finish(&tt.prev, t1)
			got := derived(next)
			want := derived(tt.want)
			want.Updated = t1.UnixMilli()
			if got != want {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

// closedAt is a connection that closed cleanly at t.
func closedAt(t time.Time) presence.ConnInfo {
	return presence.ConnInfo{Gateway: "g1", Closing: true, ClosedAt: t.UnixMilli()}
}

// finished returns r as written at t over a zero record: the state of a
// key with one revision.
func finished(r presence.Record, at time.Time) presence.Record {
	r.Finish(&presence.Record{}, at)
	return r
}

// derivedFields holds a Record's derived fields, comparable with ==.
type derivedFields struct {
	Status, Public  presence.Status
	Devices         int
	LastSeen, Since int64
	PubVer, SelfVer uint64
	Updated         int64
}

func derived(r presence.Record) derivedFields {
	return derivedFields{Status: r.Status, Public: r.Public, Devices: r.Devices, LastSeen: r.LastSeen,
		Since: r.Since, PubVer: r.PubVer, SelfVer: r.SelfVer, Updated: r.Updated}
}

func TestRecordFinishCountsEveryChange(t *testing.T) {
	// A reader that skips revisions must still see that the public view
	// moved: PubVer grows on every public change, even when it comes back.
	var r presence.Record
	at := time.Unix(1_700_000_000, 0)
	step := func(chosen presence.Status, cs map[string]presence.ConnInfo) {
		prev := r.Clone()
		r.Chosen, r.Conns = chosen, cs
		at = at.Add(time.Second)
		r.Finish(&prev, at)
	}
	step("", conns(active))                 // offline -> online
	step(presence.Busy, conns(active))      // -> busy
	step("", conns(active))                 // -> online
	step(presence.Invisible, nil)           // -> offline, and the user chose invisible
	step(presence.Invisible, conns(active)) // invisible: still offline to others
	if r.PubVer != 4 {
		t.Errorf("PubVer = %d after four public changes, want 4", r.PubVer)
	}
	if r.SelfVer != 5 {
		t.Errorf("SelfVer = %d after five changes of status or devices, want 5", r.SelfVer)
	}
	if want := time.Unix(1_700_000_004, 0).Unix(); r.LastSeen != want {
		t.Errorf("LastSeen = %d, want %d (the moment the user went offline)", r.LastSeen, want)
	}
}

func TestRecordCloneIsDeep(t *testing.T) {
	r := presence.Record{Conns: conns(active)}
	c := r.Clone()
	c.SetConn("z", idle)
	delete(c.Conns, "a")
	if _, ok := r.Conns["a"]; !ok || len(r.Conns) != 1 {
		t.Errorf("changing a clone changed the original: %v", r.Conns)
	}
	var empty presence.Record
	empty.SetConn("x", active)
	if len(empty.Conns) != 1 {
		t.Errorf("SetConn on a record without connections: %v", empty.Conns)
	}
}

func TestRecordPresence(t *testing.T) {
	r := presence.Record{Public: presence.Busy, LastSeen: 42}
	if got := r.Presence("alice"); got != (presence.Presence{UserID: "alice", Status: presence.Busy, LastSeen: 42}) {
		t.Errorf("got %+v", got)
	}
	var never presence.Record
	if got := never.Presence("bob"); got.Status != presence.Offline {
		t.Errorf("a record never written: got %+v, want offline", got)
	}
	ev := presence.Event{UserID: "carol", Status: presence.Away, LastSeen: 7, Rev: 9}
	if got := ev.Presence(); got != (presence.Presence{UserID: "carol", Status: presence.Away, LastSeen: 7}) {
		t.Errorf("event presence: got %+v", got)
	}
}

func TestStatuses(t *testing.T) {
	tests := []struct {
		in      string
		ok      bool
		public  presence.Status
		visible bool
	}{
		{"online", true, presence.Online, true},
		{"away", true, presence.Away, true},
		{"busy", true, presence.Busy, true},
		{"invisible", true, presence.Offline, false},
		{"offline", false, presence.Offline, false},
		{"", false, "", false},
		{"Online", false, "", false},
		{"dnd", false, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			st, err := presence.ParseChosen(tt.in)
			if tt.ok != (err == nil) {
				t.Fatalf("ParseChosen(%q) = %q, %v; want ok %v", tt.in, st, err, tt.ok)
			}
			if !tt.ok {
				if !errors.Is(err, presence.ErrInvalidStatus) {
					t.Errorf("error %v does not wrap ErrInvalidStatus", err)
				}
				st = presence.Status(tt.in)
			}
			if tt.public != "" && st.Public() != tt.public {
				t.Errorf("Public() = %s, want %s", st.Public(), tt.public)
			}
			if st.Visible() != tt.visible {
				t.Errorf("Visible() = %v, want %v", st.Visible(), tt.visible)
			}
		})
	}
}
