package presence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/presence"
)

func TestValidUserID(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"alice", true},
		{"A-z_0-9", true},
		{"x", true},
		{strings.Repeat("a", presence.MaxUserIDLen), true},
		{strings.Repeat("a", presence.MaxUserIDLen+1), false},
		{"", false},
		{"al.ice", false}, // a subject and key token separator
		{"al*", false},
		{"al>", false},
		{"al ice", false},
		{"alïce", false},
		{"a/b", false},
		{"a\x00", false},
	}
	for _, tt := range tests {
		if got := presence.ValidUserID(tt.in); got != tt.want {
			t.Errorf("ValidUserID(%q) = %v, want %v", tt.in, got, tt.want)
		}
		if got := presence.ValidToken(tt.in); got != tt.want {
			t.Errorf("ValidToken(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestValidDevice(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"web", true},
		{"iPhone 15.2", true},
		{"desk_top-2", true},
		{strings.Repeat("d", presence.MaxDeviceLen), true},
		{strings.Repeat("d", presence.MaxDeviceLen+1), false},
		{"", false},
		{"tab\t", false},
		{"a/b", false},
		{"<script>", false},
		{"héllo", false},
	}
	for _, tt := range tests {
		if got := presence.ValidDevice(tt.in); got != tt.want {
			t.Errorf("ValidDevice(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestConnKeys(t *testing.T) {
	if got := presence.ConnKey("alice", "c1"); got != "alice.c1" {
		t.Errorf("ConnKey = %q", got)
	}
	if got := presence.ConnKeyFilter("alice"); got != "alice.*" {
		t.Errorf("ConnKeyFilter = %q", got)
	}
	tests := []struct {
		key          string
		user, connID string
		ok           bool
	}{
		{"alice.c1", "alice", "c1", true},
		{"alice.XyZ_09-", "alice", "XyZ_09-", true},
		{"alice", "", "", false},
		{"alice.", "", "", false},
		{".c1", "", "", false},
		{"alice.c1.extra", "", "", false},
		{"al ice.c1", "", "", false},
		{"", "", "", false},
	}
	for _, tt := range tests {
		user, connID, ok := presence.SplitConnKey(tt.key)
		if user != tt.user || connID != tt.connID || ok != tt.ok {
			t.Errorf("SplitConnKey(%q) = %q, %q, %v; want %q, %q, %v", tt.key, user, connID, ok, tt.user, tt.connID, tt.ok)
		}
	}
	// Every key ConnKey makes of valid ids splits back.
	u, c, ok := presence.SplitConnKey(presence.ConnKey("bob", "ABCdef123"))
	if !ok || u != "bob" || c != "ABCdef123" {
		t.Errorf("round trip: %q, %q, %v", u, c, ok)
	}
}

func TestGraphKeys(t *testing.T) {
	if got := presence.FollowKey("a", "b"); got != "follows.a.b" {
		t.Errorf("FollowKey = %q", got)
	}
	if got := presence.FollowingFilter("a"); got != "follows.a.*" {
		t.Errorf("FollowingFilter = %q", got)
	}
	if got := presence.FollowersFilter("b"); got != "follows.*.b" {
		t.Errorf("FollowersFilter = %q", got)
	}
	follows := []struct {
		key  string
		a, b string
		ok   bool
	}{
		{"follows.alice.bob", "alice", "bob", true},
		{"follows.alice", "", "", false},
		{"follows.alice.bob.carol", "", "", false},
		{"follows..bob", "", "", false},
		{"follows.alice.", "", "", false},
		{"settings.alice", "", "", false},
		{"alice.bob", "", "", false},
		{"follows.al ice.bob", "", "", false},
	}
	for _, tt := range follows {
		a, b, ok := presence.ParseFollowKey(tt.key)
		if a != tt.a || b != tt.b || ok != tt.ok {
			t.Errorf("ParseFollowKey(%q) = %q, %q, %v; want %q, %q, %v", tt.key, a, b, ok, tt.a, tt.b, tt.ok)
		}
	}

	if got := presence.SettingsKey("alice"); got != "settings.alice" {
		t.Errorf("SettingsKey = %q", got)
	}
	settings := []struct {
		key  string
		user string
		ok   bool
	}{
		{"settings.alice", "alice", true},
		{"settings.", "", false},
		{"settings.al.ice", "", false},
		{"follows.alice.bob", "", false},
	}
	for _, tt := range settings {
		user, ok := presence.ParseSettingsKey(tt.key)
		if ok != tt.ok || ok && user != tt.user {
			t.Errorf("ParseSettingsKey(%q) = %q, %v; want %q, %v", tt.key, user, ok, tt.user, tt.ok)
		}
	}
}

func TestSubjects(t *testing.T) {
	if got := presence.EventSubject("alice"); got != "presence.event.alice" {
		t.Errorf("EventSubject = %q", got)
	}
	if got := presence.SelfSubject("gw-1"); got != "presence.gw.gw-1.self" {
		t.Errorf("SelfSubject = %q", got)
	}
	if got := presence.StreamName(presence.ConnsBucket); got != "KV_presence_conns" {
		t.Errorf("StreamName = %q", got)
	}
	if got := presence.KeySubject(presence.StatusBucket, "alice"); got != "$KV.presence_status.alice" {
		t.Errorf("KeySubject = %q", got)
	}
	// The wildcard matches every event subject and nothing else greendot
	// publishes.
	if !subjectMatches(presence.EventWildcard, presence.EventSubject("x")) ||
		subjectMatches(presence.EventWildcard, presence.SelfSubject("g")) {
		t.Errorf("EventWildcard %q matches the wrong subjects", presence.EventWildcard)
	}
}

// subjectMatches reports whether a NATS subject matches a filter with *
// and > wildcards.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || tok != "*" && tok != s[i] {
			return false
		}
	}
	return len(f) == len(s)
}

func TestSettings(t *testing.T) {
	decode := []struct {
		in   string
		want presence.Visibility
		err  bool
	}{
		{"nobody", presence.Nobody, false},
		{" everyone\n", presence.Everyone, false},
		{"contacts", presence.Contacts, false},
		{`{"last_seen":"nobody"}`, presence.Nobody, false},
		{`{"last_seen":"everyone","other":1}`, presence.Everyone, false},
		{`{}`, presence.Contacts, false},
		{`{"last_seen":"friends"}`, "", true},
		{`{"last_seen":3}`, "", true},
		{`"nobody"`, "", true},
		{"Nobody", "", true},
		{"", "", true},
		{"{", "", true},
	}
	for _, tt := range decode {
		st, err := presence.DecodeSettings([]byte(tt.in))
		if tt.err {
			if err == nil {
				t.Errorf("DecodeSettings(%q) = %+v, want an error", tt.in, st)
			}
			continue
		}
		if err != nil || st.LastSeenVisibility() != tt.want {
			t.Errorf("DecodeSettings(%q) = %+v, %v; want %s", tt.in, st, err, tt.want)
		}
	}
	if _, err := presence.DecodeSettings([]byte(`{"last_seen":"friends"}`)); !errors.Is(err, presence.ErrInvalidVisibility) {
		t.Errorf("an unknown visibility: %v does not wrap ErrInvalidVisibility", err)
	}
	if _, err := presence.ParseVisibility("all"); !errors.Is(err, presence.ErrInvalidVisibility) {
		t.Errorf("ParseVisibility(all): %v", err)
	}

	show := []struct {
		vis           presence.Visibility
		self, contact bool
		want          bool
	}{
		{"", false, true, true}, // contacts by default
		{"", false, false, false},
		{presence.Everyone, false, false, true},
		{presence.Contacts, false, true, true},
		{presence.Contacts, false, false, false},
		{presence.Nobody, false, true, false},
		{presence.Nobody, true, false, true}, // the user always sees their own
	}
	for _, tt := range show {
		st := presence.Settings{LastSeen: tt.vis}
		if got := st.ShowLastSeen(tt.self, tt.contact); got != tt.want {
			t.Errorf("%q.ShowLastSeen(self %v, contact %v) = %v, want %v", tt.vis, tt.self, tt.contact, got, tt.want)
		}
	}
}

func TestTTLSeconds(t *testing.T) {
	tests := []struct{ in, want time.Duration }{
		{0, time.Second},
		{-time.Second, time.Second},
		{time.Millisecond, time.Second},
		{time.Second, time.Second},
		{time.Second + time.Nanosecond, 2 * time.Second},
		{1500 * time.Millisecond, 2 * time.Second},
		{30 * time.Second, 30 * time.Second},
	}
	for _, tt := range tests {
		if got := presence.TTLSeconds(tt.in); got != tt.want {
			t.Errorf("TTLSeconds(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestEntryOp(t *testing.T) {
	tests := []struct {
		name string
		h    nats.Header
		want jetstream.KeyValueOp
	}{
		{"a put", nil, jetstream.KeyValuePut},
		{"kv delete", nats.Header{"KV-Operation": {"DEL"}}, jetstream.KeyValueDelete},
		{"kv purge", nats.Header{"KV-Operation": {"PURGE"}}, jetstream.KeyValuePurge},
		{"expiry marker", nats.Header{jetstream.MarkerReasonHeader: {"MaxAge"}}, jetstream.KeyValuePurge},
		{"purge marker", nats.Header{jetstream.MarkerReasonHeader: {"Purge"}}, jetstream.KeyValuePurge},
		{"remove marker", nats.Header{jetstream.MarkerReasonHeader: {"Remove"}}, jetstream.KeyValueDelete},
		{"other headers", nats.Header{"Nats-TTL": {"5s"}}, jetstream.KeyValuePut},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := presence.EntryOp(tt.h); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBucketConfig(t *testing.T) {
	conns, err := presence.BucketConfig(presence.ConnsBucket, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// History 1: with more, TTLs are raised to the marker TTL and an older
	// revision can come back when the newest expires (docs/architecture.md,
	// "State").
	if conns.History != 1 || conns.LimitMarkerTTL != presence.DefaultMarkerTTL || conns.Replicas != 1 {
		t.Errorf("conns bucket: history %d, marker TTL %v, replicas %d", conns.History, conns.LimitMarkerTTL, conns.Replicas)
	}
	status, err := presence.BucketConfig(presence.StatusBucket, presence.BucketOptions{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if status.History != presence.StatusHistory || status.LimitMarkerTTL != 0 || status.Replicas != 3 {
		t.Errorf("status bucket: history %d, marker TTL %v, replicas %d", status.History, status.LimitMarkerTTL, status.Replicas)
	}
	rooms, err := presence.BucketConfig(presence.RoomsBucket, presence.BucketOptions{Replicas: 3, MarkerTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rooms.History != 1 || rooms.LimitMarkerTTL != 2*time.Second || rooms.Replicas != 3 {
		t.Errorf("rooms bucket: history %d, marker TTL %v, replicas %d", rooms.History, rooms.LimitMarkerTTL, rooms.Replicas)
	}
	if _, err := presence.BucketConfig("nope", presence.BucketOptions{}); err == nil {
		t.Error("an unknown bucket has a configuration")
	}

	opts := []struct {
		o  presence.BucketOptions
		ok bool
	}{
		{presence.BucketOptions{}, true},
		{presence.BucketOptions{Replicas: 5, MarkerTTL: time.Second}, true},
		{presence.BucketOptions{Replicas: 6}, false},
		{presence.BucketOptions{Replicas: -1}, false},
		{presence.BucketOptions{MarkerTTL: 500 * time.Millisecond}, false},
	}
	for _, tt := range opts {
		if err := tt.o.Validate(); (err == nil) != tt.ok {
			t.Errorf("%+v.Validate() = %v, want ok %v", tt.o, err, tt.ok)
		}
	}
}
