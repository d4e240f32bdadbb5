package systest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
// to any other.
type HookSink struct {
	// URL is where the webhooks process is to POST.
	URL string

	secret []byte
	mu     sync.Mutex
	events []webhook.Event
	bad    []string
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
		s.events = append(s.events, b.Events...)
	}))
	tb.Cleanup(srv.Close)
	s.URL = srv.URL + "/hooks/presence"
	return s
}

// Await waits up to 30s for an event saying user has status; a delivery
// refused meanwhile fails the test.
func (s *HookSink) Await(tb testing.TB, user string, status presence.Status) {
	tb.Helper()
	natstest.CheckFor(tb, 30*time.Second, 10*time.Millisecond, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.bad) > 0 {
			tb.Fatalf("deliveries refused: %v", s.bad)
		}
		for _, ev := range s.events {
			if ev.UserID == user && ev.Status == status {
				return nil
			}
		}
		return fmt.Errorf("no webhook event %s %s among %+v", user, status, s.events)
	})
}
