package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/syncbuf"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/webhook"
)

// wait bounds every wait for something to happen: generous, for a loaded
// machine.
const wait = 30 * time.Second

var secret = []byte("test-secret-0123456789")

// env is an embedded NATS server with greendot's buckets.
type env struct {
	srv   *server.Server
	nc    *nats.Conn
	kv    jetstream.KeyValue
	store *presence.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := presence.EnsureFeed(ctx, store.JetStream(), presence.BucketOptions{}, 0); err != nil {
		t.Fatal(err)
	}
	kv, err := store.JetStream().KeyValue(ctx, presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	return &env{srv: srv, nc: nc, kv: kv, store: store}
}

// choose writes a user's record as greendot's writers do, by
// compare-and-set through the store: the user, with one connection,
// chooses status. It returns the revision.
func (e *env) choose(t *testing.T, user string, status presence.Status) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, rev, written, err := e.store.UpdateStatus(ctx, user, func(r *presence.Record) error {
		r.SetConn("c1", presence.ConnInfo{Gateway: "gw1", Lease: "1", Since: 1})
		r.Chosen = status
		return nil
	})
	if err != nil || !written {
		t.Fatalf("write %s's record: written %v, %v", user, written, err)
	}
	return rev
}

// put writes a user's record as a writer would and returns its revision.
func (e *env) put(t *testing.T, user string, status presence.Status, devices int, lastSeen int64) uint64 {
	t.Helper()
	rec := presence.Record{Status: status, Public: status.Public(), Devices: devices, LastSeen: lastSeen, Updated: time.Now().UnixMilli()}
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := e.kv.Put(context.Background(), presence.StatusKey(user), data)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// awaitFed waits until presence_feed holds n revisions of a user: NATS
// copies them from the status bucket's stream a moment after each write,
// and the bucket keeps only the last presence.StatusHistory, so a test
// that writes more than that in a burst waits for each copy.
func (e *env) awaitFed(t *testing.T, user string, n uint64) {
	t.Helper()
	subject := presence.KeySubject(presence.StatusBucket, presence.StatusKey(user))
	natstest.CheckFor(t, wait, 2*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		st, err := jetstream.New(e.nc)
		if err != nil {
			return err
		}
		feed, err := st.Stream(ctx, presence.FeedStream)
		if err != nil {
			return err
		}
		info, err := feed.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			return err
		}
		if got := info.State.Subjects[subject]; got < n {
			return fmt.Errorf("presence_feed holds %d revisions of %s, want %d", got, user, n)
		}
		return nil
	})
}

// pinned returns the id of the client the webhooks consumer is pinned to,
// or "" when none.
func (e *env) pinned(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cons, err := e.store.JetStream().Consumer(ctx, presence.FeedStream, presence.WebhooksConsumer)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range cons.CachedInfo().PriorityGroups {
		if g.Group == webhook.PriorityGroup {
			return g.PinnedClientID
		}
	}
	return ""
}

// request is one POST a receiver got.
type request struct {
	at      time.Time
	attempt int
	status  int
	events  []webhook.Event
	// signature and body are the request's signature header and body.
	signature string
	body      []byte
}

// receiver is a real HTTP endpoint that verifies every delivery and
// answers what respond says (200 when nil).
type receiver struct {
	t   *testing.T
	URL string

	mu       sync.Mutex
	respond  func(n int, w http.ResponseWriter, r *http.Request) int
	requests []request
	accepted []webhook.Event
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{t: t}
	srv := httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(srv.Close)
	rc.URL = srv.URL + "/hooks/presence"
	return rc
}

func (rc *receiver) setRespond(f func(n int, w http.ResponseWriter, r *http.Request) int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.respond = f
}

// refusal is a receiver's answer other than 200: a status, with a
// Retry-After when not empty.
type refusal struct {
	status     int
	retryAfter string
}

// refuse has the receiver answer its first requests with rs, in turn, and
// the later ones with 200.
func (rc *receiver) refuse(rs ...refusal) {
	rc.setRespond(func(n int, w http.ResponseWriter, _ *http.Request) int {
		if n > len(rs) {
			return http.StatusOK
		}
		if ra := rs[n-1].retryAfter; ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		return rs[n-1].status
	})
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	switch {
	case r.Method != http.MethodPost || r.URL.Path != "/hooks/presence":
		rc.t.Errorf("%s %s, want POST /hooks/presence", r.Method, r.URL.Path)
	case r.Header.Get("Content-Type") != "application/json":
		rc.t.Errorf("Content-Type %q", r.Header.Get("Content-Type"))
	}
	if err := signature.Verify(secret, r.Header.Get(signature.Header), body, time.Now(), 0); err != nil {
		rc.t.Errorf("delivery does not verify: %v", err)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var b webhook.Batch
	if err := json.Unmarshal(body, &b); err != nil || len(b.Events) == 0 {
		rc.t.Errorf("body %s: %v, want a batch of events", body, err)
	}
	attempt, _ := strconv.Atoi(r.Header.Get(webhook.AttemptHeader))

	rc.mu.Lock()
	n := len(rc.requests) + 1
	respond := rc.respond
	rc.mu.Unlock()
	status := http.StatusOK
	if respond != nil {
		r.Body = io.NopCloser(bytes.NewReader(body)) // for respond to read again
		status = respond(n, w, r)
	}
	rc.mu.Lock()
	rc.requests = append(rc.requests, request{at: time.Now(), attempt: attempt, status: status, events: b.Events,
		signature: r.Header.Get(signature.Header), body: body})
	if status/100 == 2 {
		rc.accepted = append(rc.accepted, b.Events...)
	}
	rc.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
	}
}

func (rc *receiver) snapshot() ([]request, []webhook.Event) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.requests), slices.Clone(rc.accepted)
}

// waitAccepted waits until the receiver accepted an event of each of
// want (user@rev), and returns what it accepted.
func (rc *receiver) waitAccepted(t *testing.T, want ...string) []webhook.Event {
	t.Helper()
	var got []webhook.Event
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		_, got = rc.snapshot()
		have := map[string]bool{}
		for _, ev := range got {
			have[key(ev)] = true
		}
		for _, w := range want {
			if !have[w] {
				return fmt.Errorf("no %s among %v", w, keys(got))
			}
		}
		return nil
	})
	return got
}

func key(ev webhook.Event) string { return ev.UserID + "@" + strconv.FormatUint(ev.Rev, 10) }

func keys(evs []webhook.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = key(ev)
	}
	return out
}

func at(user string, rev uint64) string { return user + "@" + strconv.FormatUint(rev, 10) }

// checkOrder fails unless each user's events came in the order of their
// revisions (a revision may come again, never an older one).
func checkOrder(t *testing.T, evs []webhook.Event) {
	t.Helper()
	last := map[string]uint64{}
	for _, ev := range evs {
		if ev.Rev < last[ev.UserID] {
			t.Errorf("%s after %s@%d: out of order in %v", key(ev), ev.UserID, last[ev.UserID], keys(evs))
		}
		last[ev.UserID] = ev.Rev
	}
}

// running is a webhooks process under test.
type running struct {
	svc    *webhook.Service
	cancel context.CancelFunc
	done   chan error
	logs   *syncbuf.Buffer
}

// start runs a webhooks process with cfg (URL and Secret filled in from
// rc) until stop or the end of the test, and waits for it to be ready.
func start(t *testing.T, e *env, rc *receiver, cfg webhook.Config) *running {
	t.Helper()
	return startOn(t, e.nc, rc, cfg)
}

// startOn starts a webhooks process as start does, over nc.
func startOn(t *testing.T, nc *nats.Conn, rc *receiver, cfg webhook.Config) *running {
	t.Helper()
	cfg.URL, cfg.Secret = rc.URL, secret
	r := &running{logs: &syncbuf.Buffer{}, done: make(chan error, 1)}
	cfg.Logger = slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc, err := webhook.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.svc = svc
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- svc.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error { return svc.Ready(context.Background()) })
	return r
}

// stop stops the process and waits for Run to return.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run: %v", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(wait):
		t.Fatal("Run did not return after its stop")
	}
}

func (r *running) metric(name string, labels ...string) float64 {
	v, _ := metricstest.Value(r.svc.Registry(), name, labels...)
	return v
}

// awaitMetric waits until the process's metric name, with labels (name,
// value pairs), is want.
func (r *running) awaitMetric(t *testing.T, name string, want float64, labels ...string) {
	t.Helper()
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		if v := r.metric(name, labels...); v != want {
			return fmt.Errorf("%s = %v, want %v", series(name, labels), v, want)
		}
		return nil
	})
}

// awaitMetricAtLeast waits until the process's metric name, with labels,
// is least or more.
func (r *running) awaitMetricAtLeast(t *testing.T, name string, least float64, labels ...string) {
	t.Helper()
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		if v := r.metric(name, labels...); v < least {
			return fmt.Errorf("%s = %v, want %v or more", series(name, labels), v, least)
		}
		return nil
	})
}

// series names a metric with its labels (name, value pairs) as Prometheus
// writes it: greendot_webhook_failures_total{reason="timeout"}.
func series(name string, labels []string) string {
	if len(labels) == 0 {
		return name
	}
	var pairs []string
	for i := 0; i+1 < len(labels); i += 2 {
		pairs = append(pairs, fmt.Sprintf("%s=%q", labels[i], labels[i+1]))
	}
	return name + "{" + strings.Join(pairs, ",") + "}"
}
