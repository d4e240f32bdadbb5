// Package metrics holds what greendot's processes share about Prometheus
// metrics: a registry per service, helpers that create and register
// metrics on it, common buckets, and the /metrics handler.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// LatencyBuckets are histogram buckets, in seconds, for latencies from a
// tenth of a millisecond to ten seconds.
var LatencyBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// NewRegistry returns a registry with the Go runtime and process
// collectors, for one process's metrics.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves the metrics gathered by g in the Prometheus text format.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}

// Factory creates metrics and registers them on reg. A nil reg creates
// metrics that are not registered anywhere.
type Factory struct{ reg prometheus.Registerer }

// NewFactory returns a Factory registering on reg.
func NewFactory(reg prometheus.Registerer) Factory { return Factory{reg} }

func (f Factory) register(c prometheus.Collector) {
	if f.reg != nil {
		f.reg.MustRegister(c)
	}
}

// Counter creates and registers a counter.
func (f Factory) Counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	f.register(c)
	return c
}

// CounterVec creates and registers a counter with labels.
func (f Factory) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	f.register(c)
	return c
}

// Histogram creates and registers a histogram.
func (f Factory) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	f.register(h)
	return h
}

// HistogramVec creates and registers a histogram with labels.
func (f Factory) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	f.register(h)
	return h
}

// CounterFunc creates and registers a counter whose value fn reports when
// the metrics are gathered; fn must never report less than before.
func (f Factory) CounterFunc(name, help string, fn func() float64) {
	f.register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, fn))
}

// GaugeFunc creates and registers a gauge whose value fn reports when the
// metrics are gathered.
func (f Factory) GaugeFunc(name, help string, fn func() float64) {
	f.register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn))
}
