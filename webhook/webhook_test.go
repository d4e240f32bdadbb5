package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/internal/freeport"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/webhook"
)

// fast is a configuration that waits little.
func fast() webhook.Config {
	return webhook.Config{BatchSize: 10, BatchWait: 50 * time.Millisecond, MinBackoff: 50 * time.Millisecond,
		MaxBackoff: time.Second, RateLimit: 1000, Timeout: 5 * time.Second, PinnedTTL: 3 * time.Second}
}

// TestDeliversTransitions writes a few users' records and checks that the
// receiver gets every transition, signed, in order, with what each
// event carries, and nothing for a record written again unchanged.
func TestDeliversTransitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	r := start(t, e, rc, fast())

	a1 := e.put(t, "alice", presence.Online, 1, 100)
	a2 := e.put(t, "alice", presence.Online, 1, 100) // no transition
	a3 := e.put(t, "alice", presence.Online, 2, 100)
	b1 := e.put(t, "bob", presence.Busy, 1, 200)
	a4 := e.put(t, "alice", presence.Offline, 0, 300)
	b2 := e.put(t, "bob", presence.Invisible, 1, 250)
	if err := e.kv.Delete(t.Context(), "carol"); err != nil {
		t.Fatal(err)
	}
	got := rc.waitAccepted(t, at("alice", a1), at("alice", a3), at("bob", b1), at("alice", a4), at("bob", b2))
	checkOrder(t, got)
	if slices.Contains(keys(got), at("alice", a2)) {
		t.Errorf("the unchanged revision %d was delivered: %v", a2, keys(got))
	}
	want := map[string]webhook.Event{
		at("alice", a3): {UserID: "alice", Status: presence.Online, Devices: 2, LastSeen: 100, Rev: a3},
		at("alice", a4): {UserID: "alice", Status: presence.Offline, Devices: 0, LastSeen: 300, Rev: a4},
		at("bob", b2):   {UserID: "bob", Status: presence.Invisible, Devices: 1, LastSeen: 250, Rev: b2},
	}
	for _, ev := range got {
		w, ok := want[key(ev)]
		if !ok {
			continue
		}
		if ev.At == 0 || time.Since(time.UnixMilli(ev.At)) > time.Minute {
			t.Errorf("%s: at %d, want when it was written", key(ev), ev.At)
		}
		ev.At = 0
		if ev != w {
			t.Errorf("event %+v, want %+v", ev, w)
		}
	}
	r.awaitMetric(t, "greendot_webhook_revisions_skipped_total", 1, "reason", "unchanged")
	r.awaitMetric(t, "greendot_webhook_events_delivered_total", float64(len(got)))
	reqs, _ := rc.snapshot()
	for _, q := range reqs {
		if q.attempt != 1 || q.status != http.StatusOK {
			t.Errorf("request %+v: want a first attempt, accepted", q)
		}
	}
}

// TestRotatedSecret signs every delivery with the secret and with the
// previous one while it is rotated out, so that a receiver checking with
// either accepts it (the receiver checks with the secret).
func TestRotatedSecret(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	previous := []byte("the secret being rotated out")
	cfg := fast()
	cfg.PreviousSecret = previous
	start(t, e, rc, cfg)
	rev := e.put(t, "alice", presence.Online, 1, 100)
	rc.waitAccepted(t, at("alice", rev))
	reqs, _ := rc.snapshot()
	for _, q := range reqs {
		if n := strings.Count(q.signature, "v1="); n != 2 {
			t.Errorf("signature %q: %d v1, want 2", q.signature, n)
		}
		if err := signature.Verify(previous, q.signature, q.body, time.Now(), 0); err != nil {
			t.Errorf("a receiver still on the previous secret: %v", err)
		}
		if err := signature.Verify([]byte("neither of the two secrets"), q.signature, q.body, time.Now(), 0); !errors.Is(err, signature.ErrSignatureMismatch) {
			t.Errorf("a receiver with another secret: err = %v, want a mismatch", err)
		}
	}
}

// TestInvisiblePublic sends invisible users as watchers see them.
func TestInvisiblePublic(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	cfg := fast()
	cfg.Invisible = webhook.InvisiblePublic
	start(t, e, rc, cfg)
	b1 := e.put(t, "bob", presence.Online, 2, 100)
	b2 := e.put(t, "bob", presence.Invisible, 2, 150)
	got := rc.waitAccepted(t, at("bob", b1), at("bob", b2))
	for _, ev := range got {
		if ev.Rev == b2 && (ev.Status != presence.Offline || ev.Devices != 0 || ev.LastSeen != 150) {
			t.Errorf("invisible bob sent as %+v, want offline, no devices, last seen 150", ev)
		}
	}
}

// TestSlowReceiver: the first attempt outlasts the timeout; the delivery
// is sent again and accepted.
func TestSlowReceiver(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.setRespond(func(n int, _ http.ResponseWriter, r *http.Request) int {
		if n == 1 {
			<-r.Context().Done() // answers only once the sender gave up
			return 0
		}
		return http.StatusNoContent
	})
	cfg := fast()
	cfg.Timeout = time.Second
	r := start(t, e, rc, cfg)
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	got := rc.waitAccepted(t, at("alice", a1))
	if len(got) != 1 {
		t.Errorf("accepted %v, want alice once", keys(got))
	}
	r.awaitMetric(t, "greendot_webhook_failures_total", 1, "reason", "timeout")
	r.awaitMetric(t, "greendot_webhook_attempts_total", 2)
	reqs, _ := rc.snapshot()
	if len(reqs) != 2 || reqs[1].attempt != 2 {
		t.Errorf("requests %+v, want a second attempt", reqs)
	}
}

// TestFailingReceiver: 500s are retried with a growing backoff, and a 429
// or 503's Retry-After (within MaxBackoff) is honoured.
func TestFailingReceiver(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.refuse(refusal{http.StatusInternalServerError, ""}, refusal{http.StatusInternalServerError, ""},
		refusal{http.StatusTooManyRequests, "2"}, refusal{http.StatusServiceUnavailable, "1"})
	cfg := fast()
	cfg.MinBackoff = 200 * time.Millisecond
	cfg.MaxBackoff = 5 * time.Second
	r := start(t, e, rc, cfg)
	a1 := e.put(t, "alice", presence.Away, 1, 100)
	got := rc.waitAccepted(t, at("alice", a1))
	if len(got) != 1 {
		t.Errorf("accepted %v, want alice once", keys(got))
	}
	reqs, _ := rc.snapshot()
	if len(reqs) != 5 {
		t.Fatalf("%d requests, want 5", len(reqs))
	}
	// The gaps: the backoff (200ms, then 400ms), then Retry-After (2s, 1s).
	for i, min := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 2 * time.Second, time.Second} {
		gap := reqs[i+1].at.Sub(reqs[i].at)
		if gap < min-50*time.Millisecond {
			t.Errorf("attempt %d came %v after the one before, want at least %v", i+2, gap, min)
		}
		if reqs[i+1].attempt != i+2 {
			t.Errorf("request %d has attempt %d", i+2, reqs[i+1].attempt)
		}
	}
	r.awaitMetric(t, "greendot_webhook_failures_total", 3, "reason", "http_5xx")
	r.awaitMetric(t, "greendot_webhook_failures_total", 1, "reason", "http_429")
	r.awaitMetric(t, "greendot_webhook_dead_letters_total", 0)
}

// TestRetryAfterBoundedByMaxBackoff: a Retry-After longer than MaxBackoff
// (even longer than GiveUpAfter, or too large to be a duration) is waited
// for MaxBackoff only: the batch is retried and delivered, not given up.
func TestRetryAfterBoundedByMaxBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.refuse(refusal{http.StatusServiceUnavailable, "172800"}, // two days
		refusal{http.StatusTooManyRequests, time.Now().Add(48 * time.Hour).UTC().Format(http.TimeFormat)},
		refusal{http.StatusServiceUnavailable, "99999999999999999"})
	cfg := fast()
	cfg.GiveUpAfter = time.Hour
	r := start(t, e, rc, cfg)
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		if v := r.metric("greendot_webhook_dead_letters_total"); v != 0 {
			t.Fatalf("dead letters = %v, want the batch retried", v)
		}
		if _, got := rc.snapshot(); !slices.Contains(keys(got), at("alice", a1)) {
			return fmt.Errorf("alice@%d not accepted yet", a1)
		}
		return nil
	})
	reqs, _ := rc.snapshot()
	if len(reqs) != 4 {
		t.Errorf("%d requests, want 4", len(reqs))
	}
}

// TestDeadLetterOnRefusal: a 400 gives the batch up at once: counted,
// logged with its users and revisions, never sent again; the next batch
// goes out. Its user's current state, which is what it carried, is sent
// once after, in a batch of its own (see resync_test.go).
func TestDeadLetterOnRefusal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.setRespond(func(n int, _ http.ResponseWriter, _ *http.Request) int {
		if n == 1 {
			return http.StatusBadRequest
		}
		return http.StatusOK
	})
	cfg := fast()
	r := start(t, e, rc, cfg)
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	r.awaitMetric(t, "greendot_webhook_dead_letters_total", 1)
	if v := r.metric("greendot_webhook_dead_letter_events_total"); v != 1 {
		t.Errorf("dead-lettered events = %v, want 1", v)
	}
	if v := r.metric("greendot_webhook_failures_total", "reason", "http_4xx"); v != 1 {
		t.Errorf("4xx failures = %v, want 1", v)
	}
	if logs := r.logs.String(); !strings.Contains(logs, "dead-lettered") || !strings.Contains(logs, at("alice", a1)) {
		t.Errorf("logs do not name the dead letter's user and revision %s:\n%s", at("alice", a1), logs)
	}
	rc.waitAccepted(t, at("alice", a1))
	r.awaitMetric(t, "greendot_webhook_resync_users_total", 1, "result", "sent")

	b1 := e.put(t, "bob", presence.Online, 1, 100)
	rc.waitAccepted(t, at("bob", b1))
	// A process started afresh sends neither the dead letter nor alice's
	// state again.
	r.stop(t)
	start(t, e, rc, cfg)
	b2 := e.put(t, "bob", presence.Away, 1, 100)
	got := rc.waitAccepted(t, at("bob", b2))
	n := 0
	for _, k := range keys(got) {
		if k == at("alice", a1) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("alice@%d accepted %d times, want once: %v", a1, n, keys(got))
	}
	// Two requests carried her: the refused one, and the one with her
	// current state; neither is a retry.
	reqs, _ := rc.snapshot()
	var carried []request
	for _, q := range reqs {
		if slices.Contains(keys(q.events), at("alice", a1)) {
			carried = append(carried, q)
		}
	}
	if len(carried) != 2 || carried[0].status != http.StatusBadRequest || carried[0].attempt != 1 || carried[1].attempt != 1 {
		t.Errorf("requests with alice@%d: %+v, want the refused one and her current state's", a1, carried)
	}
}

// TestGiveUp: a batch failing for longer than GiveUpAfter is dead-lettered.
func TestGiveUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.setRespond(func(int, http.ResponseWriter, *http.Request) int { return http.StatusBadGateway })
	cfg := fast()
	cfg.GiveUpAfter = time.Second
	r := start(t, e, rc, cfg)
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	r.awaitMetric(t, "greendot_webhook_dead_letters_total", 1)
	reqs, _ := rc.snapshot()
	if len(reqs) < 2 {
		t.Errorf("%d attempts before giving up, want retries", len(reqs))
	}
	// No attempt starts past the give-up time (with room for a loaded
	// machine's scheduling).
	if span := reqs[len(reqs)-1].at.Sub(reqs[0].at); span > 3*time.Second {
		t.Errorf("attempts spanned %v, past the give-up time of 1s", span)
	}
	if logs := r.logs.String(); !strings.Contains(logs, "gave up") || !strings.Contains(logs, at("alice", a1)) {
		t.Errorf("logs do not say it gave up on %s:\n%s", at("alice", a1), logs)
	}
}

// TestRateCap: POSTs never come faster than RateLimit.
func TestRateCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	cfg := fast()
	cfg.BatchSize = 1
	cfg.RateLimit = 5
	start(t, e, rc, cfg)
	var want []string
	for i := range 6 {
		user := fmt.Sprintf("u%d", i)
		want = append(want, at(user, e.put(t, user, presence.Online, 1, 100)))
	}
	rc.waitAccepted(t, want...)
	reqs, _ := rc.snapshot()
	if len(reqs) != 6 {
		t.Fatalf("%d requests, want 6 (one event each)", len(reqs))
	}
	for i := 1; i < len(reqs); i++ {
		// 200ms apart, less what the server's clock reading adds.
		if gap := reqs[i].at.Sub(reqs[i-1].at); gap < 150*time.Millisecond {
			t.Errorf("request %d came %v after the one before: faster than 5 a second", i+1, gap)
		}
	}
}

// TestResume: a process started after another stopped delivers what was
// written meanwhile, and not what was delivered before.
func TestResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	r := start(t, e, rc, fast())
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	rc.waitAccepted(t, at("alice", a1))
	r.awaitMetric(t, "greendot_webhook_batches_delivered_total", 1)
	r.stop(t)

	a2 := e.put(t, "alice", presence.Away, 1, 100)
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	a3 := e.put(t, "alice", presence.Offline, 0, 400)
	start(t, e, rc, fast())
	got := rc.waitAccepted(t, at("alice", a2), at("bob", b1), at("alice", a3))
	checkOrder(t, got)
	n := 0
	for _, ev := range got {
		if key(ev) == at("alice", a1) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("alice@%d accepted %d times: %v", a1, n, keys(got))
	}
}

// TestTwoCopies runs two processes on one consumer: one serves at a time,
// every transition arrives in order per user, and when the serving one
// stops the other takes over.
func TestTwoCopies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	cfg := fast()
	cfg.BatchSize = 3
	one := start(t, e, rc, cfg)
	two := start(t, e, rc, cfg)
	users := []string{"alice", "bob", "carol"}
	statuses := []presence.Status{presence.Online, presence.Away, presence.Busy}
	var want []string
	write := func(round int) {
		for _, u := range users {
			want = append(want, at(u, e.put(t, u, statuses[round%3], 1+round%2, int64(round))))
		}
	}
	for round := range 10 {
		write(round)
	}
	rc.waitAccepted(t, want...)
	served := func(r *running) bool { return r.metric("greendot_webhook_attempts_total") > 0 }
	if served(one) == served(two) {
		t.Errorf("served by the first: %v, by the second: %v; want exactly one", served(one), served(two))
	}
	serving, other := one, two
	if served(two) {
		serving, other = two, one
	}
	serving.stop(t)
	for round := 10; round < 20; round++ {
		write(round)
	}
	got := rc.waitAccepted(t, want...)
	checkOrder(t, got)
	if !served(other) {
		t.Error("the other process did not take over")
	}
}

// TestStandbyStopKeepsThePin: a process that does not serve stops
// without taking the consumer from the one that does.
func TestStandbyStopKeepsThePin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	one := start(t, e, rc, fast())
	two := start(t, e, rc, fast())
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	rc.waitAccepted(t, at("alice", a1))
	serving, standby := one, two
	if two.metric("greendot_webhook_attempts_total") > 0 {
		serving, standby = two, one
	}
	pin := e.pinned(t)
	if pin == "" {
		t.Fatal("the consumer is pinned to no process")
	}
	standby.stop(t)
	if got := e.pinned(t); got != pin {
		t.Errorf("pinned to %q after the standby stopped, want %q still", got, pin)
	}
	a2 := e.put(t, "alice", presence.Away, 1, 100)
	rc.waitAccepted(t, at("alice", a2))
	// The process counts a batch once the receiver's answer is back.
	serving.awaitMetric(t, "greendot_webhook_events_delivered_total", 2)
}

// TestLongRetryKeepsRevisions: a delivery retried for longer than AckWait
// keeps its revisions, and those handed out after it, from being handed
// out again: each event is accepted once.
func TestLongRetryKeepsRevisions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	var first time.Time
	rc.setRespond(func(n int, _ http.ResponseWriter, _ *http.Request) int {
		if n == 1 {
			first = time.Now()
		}
		if time.Since(first) < 4500*time.Millisecond {
			return http.StatusBadGateway
		}
		return http.StatusOK
	})
	cfg := fast()
	cfg.BatchSize = 2
	cfg.AckWait = 3 * time.Second
	cfg.MaxBackoff = 200 * time.Millisecond
	start(t, e, rc, cfg)
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		if reqs, _ := rc.snapshot(); len(reqs) == 0 {
			return fmt.Errorf("no attempt yet")
		}
		return nil
	})
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	rc.waitAccepted(t, at("alice", a1), at("bob", b1))
	// Let a redelivery, if there were one, reach the receiver.
	c1 := e.put(t, "carol", presence.Online, 1, 100)
	got := rc.waitAccepted(t, at("carol", c1))
	count := map[string]int{}
	for _, k := range keys(got) {
		count[k]++
	}
	for k, n := range count {
		if n != 1 {
			t.Errorf("%s accepted %d times: %v", k, n, keys(got))
		}
	}
	checkOrder(t, got)
}

// TestLongBatchWaitKeepsRevisions: a revision that waits most of AckWait
// for its batch to fill, then for a slow endpoint, is not handed out
// again meanwhile: it is accepted once.
func TestLongBatchWaitKeepsRevisions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	rc.setRespond(func(n int, _ http.ResponseWriter, r *http.Request) int {
		if n == 1 {
			// The endpoint takes 2s to answer.
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
		}
		return http.StatusOK
	})
	cfg := fast()
	cfg.AckWait = 3 * time.Second
	cfg.BatchWait = 2500 * time.Millisecond
	start(t, e, rc, cfg)
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	rc.waitAccepted(t, at("alice", a1))
	// Let a redelivery, if there were one, reach the receiver.
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	got := rc.waitAccepted(t, at("bob", b1))
	if !slices.Equal(keys(got), []string{at("alice", a1), at("bob", b1)}) {
		t.Errorf("accepted %v, want alice@%d and bob@%d once each", keys(got), a1, b1)
	}
}

// TestTakeOverFromDeadCopy: when the serving process dies (its NATS
// connection drops, with no goodbye) while it holds a revision, the other
// takes over after PinnedTTL and waits for that revision, which comes back
// after the ack wait, before it sends what came meanwhile: every revision
// arrives, in order.
func TestTakeOverFromDeadCopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	cfg := fast()
	// The other process takes over well before the dead one's revision
	// comes again.
	cfg.AckWait = 2 * cfg.PinnedTTL
	// The dead process's revision and the two written after its death
	// reach MaxAckPending: the first comes again all the same.
	cfg.BatchSize = 3
	other, a1, a2, died := dieHolding(t, e, rc, cfg)
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	a3 := e.put(t, "alice", presence.Offline, 0, 500)
	got := rc.waitAccepted(t, at("alice", a1), at("alice", a2), at("bob", b1), at("alice", a3))
	checkOrder(t, got)
	if d := time.Since(died); d < cfg.PinnedTTL-500*time.Millisecond {
		t.Errorf("took over %v after the first died, before the pinned TTL %v", d, cfg.PinnedTTL)
	}
	// The other process delivers the 3 after alice's first, and holds
	// none back.
	other.awaitMetric(t, "greendot_webhook_events_delivered_total", 3)
	other.awaitMetric(t, "greendot_webhook_held_revisions", 0)
}

// TestStopWhileHoldingBack: a process that took over from a dead one and
// holds newer revisions back stops before the dead one's revision comes
// again; it hands them back, and the next process delivers them all in
// order.
func TestStopWhileHoldingBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	cfg := fast()
	// Long enough to see the revisions held back before alice's comes
	// again.
	cfg.AckWait = 8 * time.Second
	other, a1, a2, _ := dieHolding(t, e, rc, cfg)
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	a3 := e.put(t, "alice", presence.Offline, 0, 500)
	// Bob's and alice's newest are held back.
	other.awaitMetric(t, "greendot_webhook_held_revisions", 2)
	other.stop(t)
	if _, got := rc.snapshot(); !slices.Equal(keys(got), []string{at("alice", a1)}) {
		t.Fatalf("accepted %v before alice@%d came again, want only alice@%d", keys(got), a2, a1)
	}
	third := start(t, e, rc, cfg)
	got := rc.waitAccepted(t, at("alice", a2), at("bob", b1), at("alice", a3))
	checkOrder(t, got)
	third.awaitMetric(t, "greendot_webhook_events_delivered_total", 3)
}

// dieHolding starts a process that serves, has it deliver a first
// revision of alice, then kills its NATS connection while it POSTs her
// second, so that it dies holding it; a second process, started before,
// is to take over. It returns the second process, alice's two revisions
// and when the first died.
func dieHolding(t *testing.T, e *env, rc *receiver, cfg webhook.Config) (other *running, a1, a2 uint64, died time.Time) {
	t.Helper()
	// The first process's second POST hangs until it is abandoned.
	posting := make(chan struct{})
	rc.setRespond(func(n int, _ http.ResponseWriter, r *http.Request) int {
		if n == 2 {
			close(posting)
			<-r.Context().Done()
			return 0
		}
		return http.StatusOK
	})
	doomedNC := natstest.Connect(t, e.srv, nats.NoReconnect())
	doomed := startOn(t, doomedNC, rc, cfg)
	a1 = e.put(t, "alice", presence.Online, 1, 100)
	rc.waitAccepted(t, at("alice", a1))
	other = start(t, e, rc, cfg)
	if v := doomed.metric("greendot_webhook_attempts_total"); v != 1 {
		t.Fatalf("the first process made %v attempts, want 1: it serves", v)
	}
	a2 = e.put(t, "alice", presence.Away, 1, 100)
	select {
	case <-posting:
	case <-time.After(wait):
		t.Fatal("the first process did not send alice's second revision")
	}
	doomedNC.Close()
	died = time.Now()
	// Its POST is abandoned, and nothing of it reaches NATS.
	doomed.stop(t)
	return other, a1, a2, died
}

// TestReceiverDown: an endpoint that is not listening at all is retried
// (network failures) until it listens again.
func TestReceiverDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	// An address nothing listens on, until the receiver does.
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	rc.URL = "http://" + addr + "/hooks/presence"
	r := start(t, e, rc, fast())
	a1 := e.put(t, "alice", presence.Online, 1, 100)
	// It is retried.
	r.awaitMetricAtLeast(t, "greendot_webhook_failures_total", 2, "reason", "network")
	// It listens again, on the same address.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(rc.serve))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	got := rc.waitAccepted(t, at("alice", a1))
	if len(got) != 1 {
		t.Errorf("accepted %v, want alice once", keys(got))
	}
}

// TestOutageLosesNothing: while the receiver answers 503, one user makes
// three times as many transitions as presence_status keeps per user
// (presence.StatusHistory), back to back, through the store as greendot's
// writers make them; once the receiver answers again, every transition
// arrives, in order, none lost, because the process reads presence_feed
// and the writers never let the bucket drop a revision it has not copied.
func TestOutageLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	var down atomic.Bool
	down.Store(true)
	rc.setRespond(func(_ int, w http.ResponseWriter, _ *http.Request) int {
		if down.Load() {
			w.Header().Set("Retry-After", "1")
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	cfg := fast()
	// Two revisions handed out at a time: the others wait in the stream
	// while the first batch is retried.
	cfg.BatchSize = 2
	r := start(t, e, rc, cfg)

	// Three times what the bucket keeps: more than the process holds in
	// memory, so that revisions leave the bucket before it reads them.
	const changes = 3 * presence.StatusHistory
	cycle := []presence.Status{presence.Online, presence.Away, presence.Busy}
	var want []string
	for i := range changes {
		want = append(want, at("alice", e.choose(t, "alice", cycle[i%len(cycle)])))
	}
	// The outage is retried.
	r.awaitMetricAtLeast(t, "greendot_webhook_failures_total", 2, "reason", "http_5xx")
	// The bucket has let the oldest revisions go.
	hist, err := e.kv.History(context.Background(), presence.StatusKey("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != presence.StatusHistory {
		t.Fatalf("presence_status keeps %d revisions of alice, want %d", len(hist), presence.StatusHistory)
	}

	down.Store(false)
	got := rc.waitAccepted(t, want...)
	checkOrder(t, got)
	var revs []string
	for _, ev := range got {
		if k := key(ev); !slices.Contains(revs, k) {
			revs = append(revs, k)
		}
	}
	if !slices.Equal(revs, want) {
		t.Errorf("accepted %v, want %v in this order", revs, want)
	}
	for i, ev := range got {
		if ev.Status != cycle[slices.Index(want, key(ev))%len(cycle)] {
			t.Errorf("event %d %s is %s", i, key(ev), ev.Status)
		}
	}
}

// TestNoFeed: without presence_feed the process refuses to start, and
// says which command creates it.
func TestNoFeed(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	cfg := fast()
	cfg.URL, cfg.Secret = "http://127.0.0.1:1/hooks", secret
	svc, err := webhook.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	err = svc.Run(ctx)
	if !errors.Is(err, presence.ErrFeedNotFound) || !strings.Contains(err.Error(), "greendot buckets --feed") {
		t.Errorf("Run without presence_feed: %v, want %v", err, presence.ErrFeedNotFound)
	}
}

// TestFilters: with Users and Events, only the events of the users named
// (by id or pattern) are sent, and only for the kinds of change asked;
// the rest are acknowledged unsent, counted as filtered. A user's first
// revision this process sees is sent: it has nothing to compare it with.
func TestFilters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t)
	cfg := fast()
	cfg.Users = []string{"al*", "bob"}
	cfg.Events = []webhook.EventType{webhook.EventStatus}
	r := start(t, e, rc, cfg)

	a1 := e.put(t, "alice", presence.Online, 1, 100)
	a2 := e.put(t, "alice", presence.Online, 2, 100) // devices only
	a3 := e.put(t, "alice", presence.Busy, 2, 100)
	c1 := e.put(t, "carol", presence.Online, 1, 100) // not a user named
	b1 := e.put(t, "bob", presence.Online, 1, 100)
	b2 := e.put(t, "bob", presence.Offline, 0, 200)
	l1 := e.put(t, "albert", presence.Away, 1, 300)
	got := rc.waitAccepted(t, at("alice", a1), at("alice", a3), at("bob", b1), at("bob", b2), at("albert", l1))
	for _, k := range []string{at("alice", a2), at("carol", c1)} {
		if slices.Contains(keys(got), k) {
			t.Errorf("%s was sent: %v", k, keys(got))
		}
	}
	r.awaitMetric(t, "greendot_webhook_revisions_skipped_total", 2, "reason", "filtered")
	r.awaitMetric(t, "greendot_webhook_events_delivered_total", 5)
}
