package metricstest_test

import (
	"slices"
	"testing"

	"github.com/greendot/greendot/internal/metricstest"
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
		got, ok := metricstest.Value(reg, tt.name, tt.labels...)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Value(%s, %v) = %v, %v; want %v, %v", tt.name, tt.labels, got, ok, tt.want, tt.ok)
		}
	}

	names := metricstest.Names(reg)
	for _, want := range []string{"test_plain_total", "test_labelled_total", "test_seconds", "test_gauge", "test_func_total", "go_goroutines"} {
		if !slices.Contains(names, want) {
			t.Errorf("Names lacks %s: %v", want, names)
		}
	}
	// A labelled metric is named before it has a value.
	f.CounterVec("test_unused_total", "Never used.", "x")
	if !slices.Contains(metricstest.Names(reg), "test_unused_total") {
		t.Error("Names lacks a labelled metric with no value yet")
	}
}
