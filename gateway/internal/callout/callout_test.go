package callout

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var secret = []byte("callout tests: a secret of 32 bytes or more")

func TestParse(t *testing.T) {
	q := &Question{Watcher: "alice", Targets: []string{"bob", "carol"}}
	if got, err := parse([]byte(`{"allow":["bob","zed"]}`), q, 0); err != nil || !slices.Equal(got, []string{"bob"}) {
		t.Errorf("parse = %v, %v; want bob (zed was not asked)", got, err)
	}
	list := &Question{Watcher: "alice", List: true}
	if got, err := parse([]byte(`{"allow":["bob","carol","dave"]}`), list, 2); err != nil || !slices.Equal(got, []string{"bob", "carol"}) {
		t.Errorf("parse list = %v, %v; want the first 2", got, err)
	}
	for _, bad := range []string{``, `[]`, `{}`, `{"allow":null}`, `{"allow":"bob"}`, `{"allow":["no such id!"]}`} {
		if _, err := parse([]byte(bad), q, 0); err == nil {
			t.Errorf("parse %q: no error", bad)
		}
	}
}

// TestHTTPRetries: a connection error and 502/503/504 are retried within
// the timeout; other statuses are not.
func TestHTTPRetries(t *testing.T) {
	for _, tc := range []struct {
		first int
		calls int32
		ok    bool
	}{
		{http.StatusBadGateway, 2, true},
		{http.StatusServiceUnavailable, 2, true},
		{http.StatusGatewayTimeout, 2, true},
		{http.StatusInternalServerError, 1, false},
		{http.StatusUnauthorized, 1, false},
	} {
		var calls atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 1 {
				w.WriteHeader(tc.first)
				return
			}
			_, _ = w.Write([]byte(`{"allow":["bob"]}`))
		}))
		var observed error
		c := NewHTTP(HTTPConfig{URL: srv.URL, Secret: secret, Timeout: 10 * time.Second,
			Observe: func(_ string, _ time.Duration, err error) { observed = err }})
		got, err := c.Allowed(context.Background(), "alice", []string{"bob"})
		srv.Close()
		if (err == nil) != tc.ok || calls.Load() != tc.calls || (observed == nil) != tc.ok {
			t.Errorf("first answer %d: %v, %v after %d calls (observed %v); want ok %v after %d", tc.first, got, err, calls.Load(), observed, tc.ok, tc.calls)
		}
	}
	// Nobody listening: retried until the timeout, then an error.
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	start := time.Now()
	_, err := NewHTTP(HTTPConfig{URL: url, Secret: secret, Timeout: 300 * time.Millisecond}).Allowed(context.Background(), "alice", []string{"bob"})
	if err == nil || !strings.Contains(err.Error(), "within the timeout") {
		t.Errorf("nobody listening: %v, want a timeout error", err)
	}
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("gave up after %v, want retries for the whole timeout", took)
	}
}

// TestHTTPRedirectRefused: a redirect is not followed (the signed question
// would go elsewhere) and counts as no answer, not retried.
func TestHTTPRedirectRefused(t *testing.T) {
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		var elsewhere atomic.Int32
		other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			elsewhere.Add(1)
			_, _ = w.Write([]byte(`{"allow":["bob"]}`))
		}))
		var calls atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			http.Redirect(w, r, other.URL, code)
		}))
		var observed error
		c := NewHTTP(HTTPConfig{URL: srv.URL, Secret: secret, Timeout: 10 * time.Second,
			Observe: func(_ string, _ time.Duration, err error) { observed = err }})
		got, err := c.Allowed(context.Background(), "alice", []string{"bob"})
		_, listErr := c.List(context.Background(), "alice", 10)
		srv.Close()
		other.Close()
		if err == nil || len(got) > 0 || listErr == nil || observed == nil {
			t.Errorf("%d: Allowed = %v, %v; List error %v (observed %v); want errors and nothing allowed", code, got, err, listErr, observed)
		} else if !strings.Contains(err.Error(), "redirect") {
			t.Errorf("%d: error %q does not say it was a redirect", code, err)
		}
		if n := elsewhere.Load(); n != 0 {
			t.Errorf("%d: the redirect's target was asked %d times", code, n)
		}
		if n := calls.Load(); n != 2 {
			t.Errorf("%d: the app was asked %d times, want once per question (a redirect is not retried)", code, n)
		}
	}
}
