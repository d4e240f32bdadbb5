package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/greendot/greendot/pkg/metrics"
)

func TestOpsHandler(t *testing.T) {
	reg := metrics.NewRegistry()
	metrics.NewFactory(reg).Counter("test_plain_total", "A counter.").Inc()
	var notReady, inPart atomic.Bool
	srv := httptest.NewServer(metrics.OpsHandler(reg, func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("readiness check without a deadline")
		}
		if notReady.Load() {
			err := errors.New("nats: not connected")
			if inPart.Load() {
				return &metrics.PartNotReady{Part: "reaper", Err: err}
			}
			return err
		}
		return nil
	}))
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	for _, tt := range []struct {
		path, body string
		code       int
	}{
		{"/healthz", `"ok"`, 200},
		{"/readyz", `"ready"`, 200},
		{"/metrics", "test_plain_total 1", 200},
		{"/nothing", "", 404},
	} {
		if code, body := get(tt.path); code != tt.code || !strings.Contains(body, tt.body) {
			t.Errorf("GET %s = %d %q, want %d with %q", tt.path, code, body, tt.code, tt.body)
		}
	}
	notReady.Store(true)
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "nats: not connected") {
		t.Errorf("GET /readyz when not ready = %d %q, want 503 with the reason", code, body)
	}
	if code, body := get("/healthz"); code != 200 {
		t.Errorf("GET /healthz when not ready = %d %q, want 200", code, body)
	}
	// A part of a process that is not ready is named beside its reason.
	inPart.Store(true)
	if code, body := get("/readyz"); code != 503 || body != `{"error":"nats: not connected","part":"reaper","status":"unavailable"}`+"\n" {
		t.Errorf("GET /readyz when a part is not ready = %d %q, want 503 naming the part", code, body)
	}
}
