package fanout

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/pkg/metrics"
)

// fanoutMetrics are a fanout's Prometheus metrics, on the Service's own
// registry.
type fanoutMetrics struct {
	revisions  prometheus.Counter
	published  prometheus.Counter
	covered    prometheus.Counter
	suppressed prometheus.Counter
	self       prometheus.Counter
	ignored    *prometheus.CounterVec // by reason
	failed     prometheus.Counter
	lag        prometheus.Histogram
}

func newFanoutMetrics(reg prometheus.Registerer, s *Service) *fanoutMetrics {
	f := metrics.NewFactory(reg)
	m := &fanoutMetrics{
		revisions: f.Counter("greendot_fanout_revisions_total",
			"Revisions of presence_status received (events in)."),
		published: f.Counter("greendot_fanout_events_published_total",
			"Public presence events the fanout published on presence.event.<user> because no writer reported publishing them (a writer that died after its write or lost its connection, or one of an earlier version)."),
		covered: f.Counter("greendot_fanout_events_covered_total",
			"Public presence events their writer reported publishing, so the fanout did not."),
		suppressed: f.Counter("greendot_fanout_events_suppressed_total",
			"Revisions that changed nothing others can see (a second device, an invisible user going idle), so no public event was published."),
		self: f.Counter("greendot_fanout_self_events_published_total",
			"Self events the fanout published on presence.gw.<gateway>.self (one per gateway holding a connection of the user) because their writer did not."),
		ignored: f.CounterVec("greendot_fanout_revisions_ignored_total",
			"Revisions acknowledged without an event, by reason: not greendot's (invalid_key, undecodable), or delivered again when its events, or a newer revision's, were known to be out (stale).", "reason"),
		failed: f.Counter("greendot_fanout_revisions_failed_total",
			"Failures to process a revision: metadata that could not be read (the revision is handed back for redelivery), or events that could not be published (tried again every second until they are out); counted at each failure."),
		lag: f.Histogram("greendot_fanout_lag_seconds",
			"Time from a status record being written to its public event being published.", metrics.LatencyBuckets),
	}
	f.GaugeFunc("greendot_fanout_cached_users",
		"Users whose last published versions this fanout remembers, to suppress duplicates.",
		func() float64 { return float64(s.cached.Load()) })
	return m
}

// Registry returns the registry holding the fanout's metrics, which
// --metrics-listen serves on GET /metrics.
func (s *Service) Registry() *prometheus.Registry { return s.reg }
