package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/greendot/greendot/pkg/metrics"
)

func TestValueAndNames(t *testing.T) {
	reg := metrics.NewRegistry()
	f := metrics.NewFactory(reg)
	c := f.Counter("test_plain_total", "A counter.")
	v := f.CounterVec("test_labelled_total", "A labelled counter.", "kind", "result")
	h := f.HistogramVec("test_seconds", "A histogram.", metrics.LatencyBuckets, "op")
	f.GaugeFunc("test_gauge", "A gauge.", func() float64 { return 7 })
	n := 0.0
	f.CounterFunc("test_func_total", "A counter func.", func() float64 { n++; return n })

	c.Add(3)
	v.WithLabelValues("a", "ok").Inc()
	v.WithLabelValues("a", "error").Add(2)
	h.WithLabelValues("get").Observe(0.1)
	h.WithLabelValues("get").Observe(0.2)

	for _, tt := range []struct {
		name   string
		labels []string
		want   float64
		ok     bool
	}{
		{"test_plain_total", nil, 3, true},
		{"test_labelled_total", []string{"kind", "a", "result", "error"}, 2, true},
		{"test_labelled_total", []string{"result", "ok", "kind", "a"}, 1, true},
		{"test_labelled_total", []string{"kind", "a"}, 0, false}, // labels must all be given
		{"test_seconds", []string{"op", "get"}, 2, true},         // a histogram's sample count
		{"test_gauge", nil, 7, true},
		{"test_missing", nil, 0, false},
	} {
		got, ok := metrics.Value(reg, tt.name, tt.labels...)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Value(%s, %v) = %v, %v; want %v, %v", tt.name, tt.labels, got, ok, tt.want, tt.ok)
		}
	}

	names := metrics.Names(reg)
	for _, want := range []string{"test_plain_total", "test_labelled_total", "test_seconds", "test_gauge", "test_func_total", "go_goroutines"} {
		if !slices.Contains(names, want) {
			t.Errorf("Names lacks %s: %v", want, names)
		}
	}
	// A labelled metric is named before it has a value.
	f.CounterVec("test_unused_total", "Never used.", "x")
	if !slices.Contains(metrics.Names(reg), "test_unused_total") {
		t.Error("Names lacks a labelled metric with no value yet")
	}
}

func TestOpsHandler(t *testing.T) {
	reg := metrics.NewRegistry()
	metrics.NewFactory(reg).Counter("test_plain_total", "A counter.").Inc()
	var notReady atomic.Bool
	srv := httptest.NewServer(metrics.OpsHandler(reg, func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("readiness check without a deadline")
		}
		if notReady.Load() {
			return errors.New("nats: not connected")
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
}
