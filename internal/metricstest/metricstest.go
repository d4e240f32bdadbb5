// Package metricstest reads metrics out of a Prometheus registry, for the
// tests of this repository: a metric's value by name and labels, and the
// names a registry describes.
package metricstest

import (
	"regexp"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value of the metric called name with exactly the given
// label values (name, value pairs), summed over nothing else: a counter's
// or gauge's value, or a histogram's sample count. It reports false when no
// such metric was gathered. It is meant for tests and tools, not hot paths.
func Value(g prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true
			case m.Untyped != nil:
				return m.Untyped.GetValue(), true
			}
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, labels []string) bool {
	if len(labels)%2 != 0 || len(m.GetLabel()) != len(labels)/2 {
		return false
	}
	for i := 0; i < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// Names returns the names of every metric c describes (a registry
// describes all it holds, labelled ones included before they have a
// value), sorted.
func Names(c prometheus.Collector) []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	seen := make(map[string]bool)
	for d := range ch {
		if m := descName.FindStringSubmatch(d.String()); m != nil {
			seen[m[1]] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
