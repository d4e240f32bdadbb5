package gateway

import (
	"runtime/metrics"
	"testing"
)

func TestWorthTrimming(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name      string
		allocated uint64
		h         heapFigures
		want      bool
	}{
		{"quiet with much spare", 100 << 10, heapFigures{live: 100 * mib, free: 60 * mib, unused: 20 * mib}, true},
		{"quiet, spare in unused spans", 0, heapFigures{live: 40 * mib, unused: 10 * mib, objects: 40 * mib}, true},
		{"quiet, spare in garbage", 0, heapFigures{live: 40 * mib, objects: 50 * mib}, true},
		{"quiet, objects all live", 0, heapFigures{live: 40 * mib, objects: 40 * mib, unused: 1 * mib}, false},
		{"busy", 10 * mib, heapFigures{live: 100 * mib, free: 60 * mib}, false},
		{"quiet, little spare for its size", 0, heapFigures{live: 100 * mib, free: 10 * mib}, false},
		{"quiet, a small heap", 0, heapFigures{live: 2 * mib, free: 3 * mib}, false},
		{"small heap, small allocations count as quiet", 200 << 10, heapFigures{live: 8 * mib, free: 8 * mib}, true},
		{"small heap, larger allocations do not", 600 << 10, heapFigures{live: 8 * mib, free: 8 * mib}, false},
	} {
		if got := worthTrimming(tc.allocated, tc.h); got != tc.want {
			t.Errorf("%s: worthTrimming(%d, %+v) = %v, want %v", tc.name, tc.allocated, tc.h, got, tc.want)
		}
	}
}

// TestTrimMetricsExist: the runtime names the trim reads exist, as
// unsigned counts of bytes.
func TestTrimMetricsExist(t *testing.T) {
	have := make(map[string]metrics.ValueKind)
	for _, d := range metrics.All() {
		have[d.Name] = d.Kind
	}
	for _, name := range []string{metricAllocs, metricLive, metricFree, metricUnused, metricObjects} {
		if k, ok := have[name]; !ok || k != metrics.KindUint64 {
			t.Errorf("runtime metric %s: present %v, kind %v", name, ok, k)
		}
	}
}
