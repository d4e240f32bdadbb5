package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/system/systest"
	"github.com/greendot/greendot/webhook"
)

var secret = []byte("lastseen-test-secret-0123")

// row is a user's row of user_last_seen.
type row struct {
	Status   string
	Devices  int
	LastSeen *time.Time
	Revision int64
}

func readRow(t *testing.T, pool *pgxpool.Pool, user string) (row, bool) {
	t.Helper()
	var r row
	err := pool.QueryRow(context.Background(),
		`SELECT status, devices, last_seen, revision FROM user_last_seen WHERE user_id = $1`, user).
		Scan(&r.Status, &r.Devices, &r.LastSeen, &r.Revision)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return r, true
}

// post sends a batch to h as greendot does, signed at signedAt, and
// returns the status h answered.
func post(t *testing.T, url string, key []byte, signedAt time.Time, events ...webhook.Event) int {
	t.Helper()
	body, err := json.Marshal(webhook.Batch{Events: events})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(signature.Header, signature.Sign(key, signedAt, body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// offlineLog records the calls of OnOffline.
type offlineLog struct {
	mu    sync.Mutex
	calls []string
}

func (o *offlineLog) note(_ context.Context, ev webhook.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, fmt.Sprintf("%s@%d", ev.UserID, ev.Rev))
}

func (o *offlineLog) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.calls)
}

// TestReceiver checks the receiver alone against a real PostgreSQL: a
// duplicate delivery and an older event delivered late change nothing and
// push nothing; a wrong signature and a stale timestamp are refused
// before anything is written.
func TestReceiver(t *testing.T) {
	pool := startPostgres(t)
	ctx := context.Background()
	if err := EnsureSchema(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := EnsureSchema(ctx, pool); err != nil {
		t.Fatalf("the schema again: %v", err)
	}
	var pushed offlineLog
	srv := httptest.NewServer(&Handler{Pool: pool, Secret: secret, OnOffline: pushed.note})
	defer srv.Close()
	now := time.Now()
	online := webhook.Event{UserID: "alice", Status: presence.Online, Devices: 1, LastSeen: 1_700_000_000, Rev: 10, At: now.UnixMilli()}
	offline := webhook.Event{UserID: "alice", Status: presence.Offline, LastSeen: 1_700_000_600, Rev: 12, At: now.UnixMilli()}
	away := webhook.Event{UserID: "alice", Status: presence.Away, Devices: 1, LastSeen: 1_700_000_000, Rev: 11, At: now.UnixMilli()}

	if code := post(t, srv.URL, secret, now, online); code != http.StatusNoContent {
		t.Fatalf("first delivery: %d", code)
	}
	if r, _ := readRow(t, pool, "alice"); r.Status != "online" || r.Revision != 10 || r.Devices != 1 || r.LastSeen == nil || r.LastSeen.Unix() != 1_700_000_000 {
		t.Fatalf("row after the first delivery: %+v", r)
	}
	// The same delivery again, then the next with the first in it again.
	for _, batch := range [][]webhook.Event{{online}, {online, offline}, {offline}} {
		if code := post(t, srv.URL, secret, now, batch...); code != http.StatusNoContent {
			t.Fatalf("delivery %v: %d", batch, code)
		}
	}
	// An older event delivered late.
	if code := post(t, srv.URL, secret, now, away); code != http.StatusNoContent {
		t.Fatalf("late delivery: %d", code)
	}
	if r, _ := readRow(t, pool, "alice"); r.Status != "offline" || r.Revision != 12 || r.Devices != 0 || r.LastSeen.Unix() != 1_700_000_600 {
		t.Errorf("row = %+v, want offline at revision 12, last seen 1700000600", r)
	}
	if got := pushed.list(); !slices.Equal(got, []string{"alice@12"}) {
		t.Errorf("offline pushes %v, want one for alice@12", got)
	}
	// After a restart of the webhooks process, a user's first event may
	// repeat the state stored, with a newer revision: the row takes the
	// revision, but alice did not go offline again.
	repeat := offline
	repeat.Rev = 13
	if code := post(t, srv.URL, secret, now, repeat); code != http.StatusNoContent {
		t.Fatalf("repeated state: %d", code)
	}
	if r, _ := readRow(t, pool, "alice"); r.Status != "offline" || r.Revision != 13 {
		t.Errorf("row = %+v, want offline at revision 13", r)
	}
	if got := pushed.list(); !slices.Equal(got, []string{"alice@12"}) {
		t.Errorf("offline pushes %v after the repeated state, want only the one for alice@12", got)
	}

	// Refused: another key, a stale timestamp, a body that is not a batch.
	bob := webhook.Event{UserID: "bob", Status: presence.Online, Devices: 1, Rev: 20, At: now.UnixMilli()}
	if code := post(t, srv.URL, []byte("not-the-secret-0123456"), now, bob); code != http.StatusUnauthorized {
		t.Errorf("wrong key: %d, want 401", code)
	}
	if code := post(t, srv.URL, secret, now.Add(-10*time.Minute), bob); code != http.StatusUnauthorized {
		t.Errorf("stale timestamp: %d, want 401", code)
	}
	if code := post(t, srv.URL, secret, now, webhook.Event{Status: presence.Online, Rev: 3}); code != http.StatusBadRequest {
		t.Errorf("event without a user: %d, want 400", code)
	}
	if _, ok := readRow(t, pool, "bob"); ok {
		t.Error("a refused delivery was written")
	}
}

// recorder passes deliveries to the receiver, or answers 503 during an
// outage, and keeps every event the receiver accepted, in order.
type recorder struct {
	next    http.Handler
	outage  atomic.Bool
	refused atomic.Int64

	mu     sync.Mutex
	events []webhook.Event
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rc.outage.Load() {
		rc.refused.Add(1)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		return
	}
	var buf bytes.Buffer
	r.Body = readAll(r, &buf)
	sw := &statusWriter{ResponseWriter: w}
	rc.next.ServeHTTP(sw, r)
	if sw.status/100 != 2 {
		return
	}
	var b webhook.Batch
	if err := json.Unmarshal(buf.Bytes(), &b); err == nil {
		rc.mu.Lock()
		rc.events = append(rc.events, b.Events...)
		rc.mu.Unlock()
	}
}

func (rc *recorder) received() []webhook.Event {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.events)
}

// readAll reads r's body into buf and returns a body that reads it again.
func readAll(r *http.Request, buf *bytes.Buffer) *readCloser {
	_, _ = buf.ReadFrom(r.Body)
	return &readCloser{bytes.NewReader(buf.Bytes())}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// TestLastSeenFromRealTransitions runs the whole chain: users connect to a
// real gateway over WebSockets and change status; the reaper turns closed
// connections offline; a webhooks process POSTs the transitions to the
// receiver, which writes them into a real PostgreSQL. Midway the receiver
// has an outage (503); afterwards every transition arrives, in order per
// user, none lost, and the table holds each user's last state.
func TestLastSeenFromRealTransitions(t *testing.T) {
	pool := startPostgres(t)
	ctx := context.Background()
	if err := EnsureSchema(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var pushed offlineLog
	rc := &recorder{next: &Handler{Pool: pool, Secret: secret, OnOffline: pushed.note}}
	srv := httptest.NewServer(rc)
	defer srv.Close()

	sys := systest.Start(t, systest.Options{})
	hooks := sys.StartWebhooks(webhook.Config{URL: srv.URL + "/hooks/presence", Secret: secret,
		BatchWait: 20 * time.Millisecond, MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, RateLimit: 100})
	if err := hooks.AwaitReady(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	gw := sys.Gateway()
	record := func(user string, status presence.Status, devices int) {
		t.Helper()
		natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
			rec, err := sys.StatusOf(user)
			if err != nil {
				return err
			}
			if rec.Status != status || rec.Devices != devices {
				return fmt.Errorf("%s is %s on %d devices, want %s on %d", user, rec.Status, rec.Devices, status, devices)
			}
			return nil
		})
	}
	connect := func(user, device string) (*client.Conn, func()) {
		c := sys.Dial(gw, user, device)
		return c, systest.KeepAlive(c, 200*time.Millisecond)
	}
	closeConn := func(c *client.Conn, stop func()) {
		t.Helper()
		stop()
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}

	alice, aliceHB := connect("alice", "web")
	record("alice", presence.Online, 1)
	bobWeb, bobWebHB := connect("bob", "web")
	record("bob", presence.Online, 1)
	_, bobIOSHB := connect("bob", "ios")
	defer bobIOSHB()
	defer bobWebHB()
	record("bob", presence.Online, 2)
	carol, carolHB := connect("carol", "web")
	record("carol", presence.Online, 1)
	if err := alice.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	record("alice", presence.Busy, 1)

	// The receiver goes down; transitions go on.
	rc.outage.Store(true)
	if err := alice.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	record("alice", presence.Away, 1)
	closeConn(carol, carolHB)
	record("carol", presence.Offline, 0)
	closeConn(bobWeb, func() {})
	record("bob", presence.Online, 1)
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if n := rc.refused.Load(); n < 2 {
			return fmt.Errorf("%d deliveries refused during the outage, want retries", n)
		}
		return nil
	})

	// It comes back; one more transition after.
	rc.outage.Store(false)
	closeConn(alice, aliceHB)
	record("alice", presence.Offline, 0)

	// The table holds each user's last state: the record's status and
	// devices, from the newest revision that changed them (a revision
	// that changed nothing a backend sees is not sent).
	want := map[string]row{"alice": {Status: "offline"}, "bob": {Status: "online", Devices: 1}, "carol": {Status: "offline"}}
	natstest.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		for user, w := range want {
			r, ok := readRow(t, pool, user)
			if !ok || r.Status != w.Status || r.Devices != w.Devices {
				return fmt.Errorf("%s: row %+v (present %v), want %s on %d devices", user, r, ok, w.Status, w.Devices)
			}
		}
		return nil
	})
	for user := range want {
		rec, rev, err := sys.Store.Status(ctx, user)
		if err != nil {
			t.Fatal(err)
		}
		if string(rec.Status) != want[user].Status || rec.Devices != want[user].Devices {
			t.Errorf("%s's record %s on %d devices at the end, want what the table says", user, rec.Status, rec.Devices)
		}
		r, _ := readRow(t, pool, user)
		if r.Revision > int64(rev) {
			t.Errorf("%s: row at revision %d, past the record's %d", user, r.Revision, rev)
		}
	}
	if r, _ := readRow(t, pool, "carol"); r.LastSeen == nil || time.Since(*r.LastSeen) > time.Minute {
		t.Errorf("carol's last_seen %v, want about when she left", r.LastSeen)
	}

	// Every transition, in order per user: each user's statuses, with
	// repeats of one status (a device more or less, a duplicate) taken
	// as one.
	got := rc.received()
	statuses := map[string][]presence.Status{}
	lastRev := map[string]uint64{}
	for _, ev := range got {
		if ev.Rev < lastRev[ev.UserID] {
			t.Errorf("%s@%d after @%d: out of order", ev.UserID, ev.Rev, lastRev[ev.UserID])
		}
		lastRev[ev.UserID] = ev.Rev
		s := statuses[ev.UserID]
		if len(s) == 0 || s[len(s)-1] != ev.Status {
			statuses[ev.UserID] = append(s, ev.Status)
		}
	}
	for user := range want {
		if r, _ := readRow(t, pool, user); r.Revision != int64(lastRev[user]) {
			t.Errorf("%s: row at revision %d, the newest event received is %d", user, r.Revision, lastRev[user])
		}
	}
	for user, seq := range map[string][]presence.Status{
		"alice": {presence.Online, presence.Busy, presence.Away, presence.Offline},
		"bob":   {presence.Online},
		"carol": {presence.Online, presence.Offline},
	} {
		if !slices.Equal(statuses[user], seq) {
			t.Errorf("%s went %v, want %v", user, statuses[user], seq)
		}
	}
	var bobDevices []int
	for _, ev := range got {
		if ev.UserID == "bob" && (len(bobDevices) == 0 || bobDevices[len(bobDevices)-1] != ev.Devices) {
			bobDevices = append(bobDevices, ev.Devices)
		}
	}
	if !slices.Equal(bobDevices, []int{1, 2, 1}) {
		t.Errorf("bob's devices went %v, want [1 2 1]", bobDevices)
	}
	pushes := pushed.list()
	slices.Sort(pushes)
	if len(pushes) != 2 || !strings.HasPrefix(pushes[0], "alice@") || !strings.HasPrefix(pushes[1], "carol@") {
		t.Errorf("offline pushes %v, want one for alice and one for carol", pushes)
	}
	if v, _ := metricstest.Value(hooks.Registry(), "greendot_webhook_failures_total", "reason", "http_5xx"); v < 2 {
		t.Errorf("5xx failures = %v, want the outage's", v)
	}
	if v, _ := metricstest.Value(hooks.Registry(), "greendot_webhook_dead_letters_total"); v != 0 {
		t.Errorf("dead letters = %v, want none", v)
	}
}
