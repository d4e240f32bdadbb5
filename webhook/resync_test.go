package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/webhook"
)

// down has the receiver answer status to every request while it is set,
// and 200 after.
func (rc *receiver) down(status int) *atomic.Bool {
	var down atomic.Bool
	down.Store(true)
	rc.setRespond(func(int, http.ResponseWriter, *http.Request) int {
		if down.Load() {
			return status
		}
		return http.StatusOK
	})
	return &down
}

// current reads a user's record as the store has it, and its revision.
func (e *env) current(t *testing.T, user string) (presence.Record, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	rec, rev, err := e.store.Status(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	return rec, rev
}

// TestResyncAfterGiveUp: the endpoint fails while alice goes online then
// offline, for longer than GiveUpAfter, so that both events are
// dead-lettered. Once it answers again, and with no further change of
// alice, it receives her current state, offline, at her record's current
// revision, once.
func TestResyncAfterGiveUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	// The endpoint fails until both of alice's events are given up.
	var proc atomic.Pointer[running]
	rc.setRespond(func(int, http.ResponseWriter, *http.Request) int {
		if r := proc.Load(); r == nil || r.metric("greendot_webhook_dead_letter_events_total") < 2 {
			return http.StatusBadGateway
		}
		return http.StatusOK
	})
	cfg := fast()
	cfg.GiveUpAfter = time.Second
	r := start(t, e, rc, cfg)
	proc.Store(r)

	e.choose(t, "alice", presence.Online)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	rec, a2, _, err := e.store.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
		r.RemoveConn("c1", time.Now().UnixMilli())
		return nil
	})
	if err != nil || rec.Status != presence.Offline {
		t.Fatalf("alice goes offline: %v, %v", rec.Status, err)
	}
	got := rc.waitAccepted(t, at("alice", a2))
	if _, rev := e.current(t, "alice"); rev != a2 {
		t.Fatalf("alice's record is at %d, want %d: nothing else was to change it", rev, a2)
	}
	want := webhook.Event{UserID: "alice", Status: presence.Offline, Devices: 0, LastSeen: rec.LastSeen, Rev: a2, At: rec.Updated}
	if len(got) != 1 || got[0] != want {
		t.Errorf("accepted %+v, want only %+v", got, want)
	}
	r.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "sent")
	r.awaitMetric(t, "greendot_webhook_resync_pending_users", 0)
	if v := r.metric("greendot_webhook_dead_letters_total"); v < 1 {
		t.Errorf("%v dead letters, want alice's events given up", v)
	}
	if logs := r.logs.String(); !strings.Contains(logs, "current state delivered") {
		t.Errorf("logs do not tell of the resync:\n%s", logs)
	}
}

// TestResyncAfterRefusal: the endpoint has alice online; it refuses for
// good the batch that says she went offline, then takes deliveries again:
// it receives her current state, offline, without her changing again, and
// so does not keep her online. Her record was written again meanwhile
// with nothing changed (no event): the state goes with that revision, the
// current one.
func TestResyncAfterRefusal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	r := start(t, e, rc, fast())
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	rc.waitAccepted(t, at("alice", a1))
	r.awaitMetric(t, "greendot_webhook_batches_delivered_total", 1)

	down := rc.down(http.StatusBadRequest)
	a2 := e.put(t, "alice", presence.Offline, 0, 200)
	r.awaitMetric(t, "greendot_webhook_dead_letters_total", 1)
	a3 := e.put(t, "alice", presence.Offline, 0, 200)
	r.awaitMetric(t, "greendot_webhook_revisions_skipped_total", 1, "reason", "unchanged")
	// The rounds tried while the endpoint refuses are tried again.
	r.awaitMetricAtLeast(t, "greendot_webhook_failures_total", 2, "reason", "http_4xx")
	if v := r.metric("greendot_webhook_resync_pending_users"); v != 1 {
		t.Fatalf("%v users remembered while the endpoint refuses, want alice", v)
	}
	down.Store(false)
	got := rc.waitAccepted(t, at("alice", a3))
	if _, rev := e.current(t, "alice"); rev != a3 {
		t.Fatalf("alice's record is at %d, want %d", rev, a3)
	}
	want := []string{at("alice", a1), at("alice", a3)}
	if !slices.Equal(keys(got), want) {
		t.Errorf("accepted %v, want %v (alice@%d was refused)", keys(got), want, a2)
	}
	if last := got[len(got)-1]; last.Status != presence.Offline || last.Devices != 0 || last.LastSeen != 200 {
		t.Errorf("alice's last event %+v, want offline, last seen 200", last)
	}
	r.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "sent")
	r.awaitMetric(t, "greendot_webhook_resync_pending_users", 0)
}

// TestResyncSuperseded: a user dead-lettered whose newer event is
// delivered before the resync round is forgotten: not sent again.
func TestResyncSuperseded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.refuse(refusal{http.StatusBadRequest, ""})
	cfg := fast()
	// The round would go long after alice's next event is delivered.
	cfg.MinBackoff, cfg.MaxBackoff = 20*time.Second, 20*time.Second
	r := start(t, e, rc, cfg)
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	r.awaitMetric(t, "greendot_webhook_resync_pending_users", 1)
	a2 := e.put(t, "alice", presence.Away, 1, 100)
	got := rc.waitAccepted(t, at("alice", a2))
	r.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "superseded")
	r.awaitMetric(t, "greendot_webhook_resync_pending_users", 0)
	if !slices.Equal(keys(got), []string{at("alice", a2)}) {
		t.Errorf("accepted %v, want alice@%d only (alice@%d was refused)", keys(got), a2, a1)
	}
	if v := r.metric("greendot_webhook_resync_users_total", "result", "sent"); v != 0 {
		t.Errorf("%v users' state sent again, want none", v)
	}
}

// TestResyncRefusedUserHoldsNoOtherUp: the endpoint refuses every batch
// with mallory in it, and for a while every batch; once it takes the
// others again, alice's current
// state goes through although she was remembered with mallory: the
// rounds are split until she goes alone.
func TestResyncRefusedUserHoldsNoOtherUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	var down atomic.Bool
	down.Store(true)
	rc.setRespond(func(_ int, _ http.ResponseWriter, r *http.Request) int {
		var b webhook.Batch
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			return http.StatusBadRequest
		}
		if down.Load() || slices.ContainsFunc(b.Events, func(ev webhook.Event) bool { return ev.UserID == "mallory" }) {
			return http.StatusBadRequest
		}
		return http.StatusOK
	})
	cfg := fast()
	cfg.BatchSize = 4
	r := start(t, e, rc, cfg)
	m1 := e.put(t, "mallory", presence.Online, 1, 100)
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	r.awaitMetric(t, "greendot_webhook_dead_letter_events_total", 2)
	r.awaitMetric(t, "greendot_webhook_resync_pending_users", 2)
	down.Store(false)
	got := rc.waitAccepted(t, at("alice", a1))
	if slices.Contains(keys(got), at("mallory", m1)) {
		t.Errorf("accepted %v, with mallory's, which the endpoint refuses", keys(got))
	}
	r.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "sent")
	if v := r.metric("greendot_webhook_resync_pending_users"); v != 1 {
		t.Errorf("%v users remembered, want mallory still", v)
	}
}

// TestResyncBound: a process remembers at most so many users of dead
// letters; the others are counted and logged, and only those remembered
// have their current state sent.
func TestResyncBound(t *testing.T) {
	defer webhook.SetMaxResync(2)()
	e := newEnv(t)
	rc := newReceiver(t)
	down := rc.down(http.StatusBadRequest)
	r := start(t, e, rc, fast())
	var revs []uint64
	for _, u := range []string{"u0", "u1", "u2"} {
		revs = append(revs, e.put(t, u, presence.Online, 1, 100))
	}
	r.awaitMetric(t, "greendot_webhook_dead_letter_events_total", 3)
	r.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "overflow")
	r.awaitMetric(t, "greendot_webhook_resync_pending_users", 2)
	if logs := r.logs.String(); !strings.Contains(logs, "resync full") || !strings.Contains(logs, at("u2", revs[2])) {
		t.Errorf("logs do not name %s as not remembered:\n%s", at("u2", revs[2]), logs)
	}
	down.Store(false)
	r.awaitMetric(t, "greendot_webhook_resync_users_total", 2, "result", "sent")
	r.awaitMetric(t, "greendot_webhook_resync_pending_users", 0)
	// A change of somebody else goes after: nothing of u2 is before it.
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	got := rc.waitAccepted(t, at("u0", revs[0]), at("u1", revs[1]), at("bob", b1))
	if slices.Contains(keys(got), at("u2", revs[2])) {
		t.Errorf("accepted %v: u2, beyond the bound, was sent", keys(got))
	}
}

// TestNoResyncWithoutDeadLetter: an endpoint that fails for a while, but
// not long enough for a batch to be given up, gets every event once and
// nothing more: no user is remembered, and nothing is sent again.
func TestNoResyncWithoutDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.refuse(refusal{http.StatusServiceUnavailable, ""}, refusal{http.StatusBadGateway, ""})
	r := start(t, e, rc, fast())
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	rc.waitAccepted(t, at("alice", a1))
	a2 := e.put(t, "alice", presence.Offline, 0, 200)
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	got := rc.waitAccepted(t, at("alice", a2), at("bob", b1))
	r.awaitMetric(t, "greendot_webhook_events_delivered_total", 3)
	if !slices.Equal(keys(got), []string{at("alice", a1), at("alice", a2), at("bob", b1)}) {
		t.Errorf("accepted %v, want each event once", keys(got))
	}
	for _, m := range []string{"greendot_webhook_dead_letters_total", "greendot_webhook_resync_pending_users"} {
		if v := r.metric(m); v != 0 {
			t.Errorf("%s = %v, want 0", m, v)
		}
	}
	for _, result := range []string{"sent", "superseded", "gone", "given_up", "overflow"} {
		if v := r.metric("greendot_webhook_resync_users_total", "result", result); v != 0 {
			t.Errorf("resync users %s = %v, want 0", result, v)
		}
	}
}

// TestResyncGivenUp: a user whose current state the endpoint keeps
// failing is forgotten GiveUpAfter after the dead letter, counted and
// logged; rounds stop.
func TestResyncGivenUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.down(http.StatusBadGateway)
	cfg := fast()
	cfg.GiveUpAfter = time.Second
	r := start(t, e, rc, cfg)
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	r.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "given_up")
	r.awaitMetric(t, "greendot_webhook_resync_pending_users", 0)
	if logs := r.logs.String(); !strings.Contains(logs, "resync given up") || !strings.Contains(logs, at("alice", a1)) {
		t.Errorf("logs do not name %s as given up:\n%s", at("alice", a1), logs)
	}
	// No round is tried after: a POST of bob's, which fails, is the only
	// one that comes.
	reqs, _ := rc.snapshot()
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		now, _ := rc.snapshot()
		if len(now) == len(reqs) {
			return fmt.Errorf("no POST after bob's write")
		}
		if q := now[len(reqs)]; !slices.Equal(keys(q.events), []string{at("bob", b1)}) {
			t.Errorf("after alice was given up the endpoint got %v, want bob@%d", keys(q.events), b1)
		}
		return nil
	})
}

// keptRev returns the revision alice's key in presence_webhook_resync
// says for the consumer "webhooks", or 0 when it has none.
func (e *env) keptRev(t *testing.T, user string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kv, err := e.store.JetStream().KeyValue(ctx, presence.WebhookResyncBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(ctx, presence.ResyncKey(presence.WebhooksConsumer, user))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Rev uint64 `json:"rev"`
	}
	if err := json.Unmarshal(entry.Value(), &v); err != nil {
		t.Fatalf("%s %s: %v", presence.WebhookResyncBucket, entry.Key(), err)
	}
	return v.Rev
}

// TestResyncKeptForTheNextProcess: a process that stops while it
// remembers a user of a dead letter leaves them in
// presence_webhook_resync; the next process takes them and sends their
// current state once the endpoint takes deliveries, and their key goes.
func TestResyncKeptForTheNextProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	down := rc.down(http.StatusBadRequest)
	one := start(t, e, rc, fast())
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	one.awaitMetric(t, "greendot_webhook_resync_pending_users", 1)
	if rev := e.keptRev(t, "alice"); rev != a1 {
		t.Fatalf("alice's key says revision %d, want %d", rev, a1)
	}
	one.stop(t)
	if logs := one.logs.String(); strings.Contains(logs, "resync abandoned") || !strings.Contains(logs, "kept in "+presence.WebhookResyncBucket) {
		t.Errorf("the logs do not say alice is kept for the next process:\n%s", logs)
	}

	down.Store(false)
	two := start(t, e, rc, fast())
	got := rc.waitAccepted(t, at("alice", a1))
	if want := []string{at("alice", a1)}; !slices.Equal(keys(got), want) {
		t.Errorf("accepted %v, want %v: alice's current state, sent by the second process", keys(got), want)
	}
	two.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "taken_over")
	two.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "sent")
	two.awaitMetric(t, "greendot_webhook_resync_pending_users", 0)
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		if rev := e.keptRev(t, "alice"); rev != 0 {
			return fmt.Errorf("alice's key still says %d", rev)
		}
		return nil
	})
}

// TestResyncTakenOverByTheNextPinned: of two processes on the consumer,
// the one serving it dead-letters alice and stops; the other, started
// before the dead letter, takes her from presence_webhook_resync once it
// is handed the consumer, and sends her current state.
func TestResyncTakenOverByTheNextPinned(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	down := rc.down(http.StatusBadRequest)
	procs := []*running{start(t, e, rc, fast()), start(t, e, rc, fast())}
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	var serving, other *running
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		for i, r := range procs {
			if r.metric("greendot_webhook_resync_pending_users") == 1 {
				serving, other = r, procs[1-i]
				return nil
			}
		}
		return errors.New("neither remembers alice")
	})
	if rev := e.keptRev(t, "alice"); rev != a1 {
		t.Fatalf("alice's key says revision %d, want %d", rev, a1)
	}
	serving.stop(t)

	down.Store(false)
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	got := rc.waitAccepted(t, at("alice", a1), at("bob", b1))
	if !slices.Contains(keys(got), at("alice", a1)) {
		t.Errorf("accepted %v, want alice's current state among them", keys(got))
	}
	other.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "taken_over")
	other.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "sent")
}

// TestResyncTwoCopies: with two processes on the consumer, the one that
// gave the batch up sends alice's current state, once; the other, which
// never knew her, sends nothing.
func TestResyncTwoCopies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	down := rc.down(http.StatusBadRequest)
	one := start(t, e, rc, fast())
	two := start(t, e, rc, fast())
	both := func(name string, labels ...string) float64 {
		return one.metric(name, labels...) + two.metric(name, labels...)
	}
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		if v := both("greendot_webhook_resync_pending_users"); v != 1 {
			return fmt.Errorf("%v users remembered, want alice", v)
		}
		return nil
	})
	down.Store(false)
	rc.waitAccepted(t, at("alice", a1))
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		if v := both("greendot_webhook_resync_users_total", "result", "sent"); v != 1 {
			return fmt.Errorf("%v users' state sent, want alice's", v)
		}
		return nil
	})
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	got := rc.waitAccepted(t, at("bob", b1))
	if !slices.Equal(keys(got), []string{at("alice", a1), at("bob", b1)}) {
		t.Errorf("accepted %v, want alice's current state once, then bob", keys(got))
	}
	served := func(r *running) bool { return r.metric("greendot_webhook_attempts_total") > 0 }
	if served(one) == served(two) {
		t.Errorf("sent by the first: %v, by the second: %v; want exactly one", served(one), served(two))
	}
}
