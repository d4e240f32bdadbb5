package systest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/webhook"
)

// HookSink is an app's webhook endpoint for tests: it keeps the events of
// every delivery whose signature verifies with its secret, and answers 400
// to any other; told to (Refuse), it refuses a good one for good too.
type HookSink struct {
	// URL is where the webhooks process is to POST.
	URL string

	secret []byte
	mu     sync.Mutex
	events []webhook.Event
	bad    []string
	// refuse is the user whose next delivery is refused; "" for none.
	refuse string
}

// NewHookSink serves a HookSink that checks signatures with secret until
// the test ends.
func NewHookSink(tb testing.TB, secret []byte) *HookSink {
	s := &HookSink{secret: secret}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b webhook.Batch
		err := signature.Verify(s.secret, r.Header.Get(signature.Header), body, time.Now(), 0)
		if err == nil {
			err = json.Unmarshal(body, &b)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.bad = append(s.bad, err.Error())
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if s.refuse != "" && slices.ContainsFunc(b.Events, func(ev webhook.Event) bool { return ev.UserID == s.refuse }) {
			s.refuse = ""
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		s.events = append(s.events, b.Events...)
	}))
	tb.Cleanup(srv.Close)
	s.URL = srv.URL + "/hooks/presence"
	return s
}

// Refuse has the next good delivery that carries an event of user
// answered 422, which the webhooks process takes as refused for good: its
// batch is a dead letter.
func (s *HookSink) Refuse(user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = user
}

// Await waits up to 30s for an event saying user has status; a delivery
// refused meanwhile for a bad signature or body fails the test.
func (s *HookSink) Await(tb testing.TB, user string, status presence.Status) {
	tb.Helper()
	s.await(tb, fmt.Sprintf("%s %s", user, status), func(ev webhook.Event) bool {
		return ev.UserID == user && ev.Status == status
	})
}

// AwaitRev waits up to 30s for an event of user at revision rev or a
// later one, like Await.
func (s *HookSink) AwaitRev(tb testing.TB, user string, rev uint64) {
	tb.Helper()
	s.await(tb, fmt.Sprintf("%s@%d or later", user, rev), func(ev webhook.Event) bool {
		return ev.UserID == user && ev.Rev >= rev
	})
}

func (s *HookSink) await(tb testing.TB, what string, match func(webhook.Event) bool) {
	tb.Helper()
	natstest.CheckFor(tb, 30*time.Second, 10*time.Millisecond, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.bad) > 0 {
			tb.Fatalf("deliveries refused: %v", s.bad)
		}
		if slices.ContainsFunc(s.events, match) {
			return nil
		}
		return fmt.Errorf("no webhook event %s among %+v", what, s.events)
	})
}
