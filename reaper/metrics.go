package reaper

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
)

// reaperMetrics are a reaper's Prometheus metrics, on the Service's own
// registry.
type reaperMetrics struct {
	markers     *prometheus.CounterVec   // by reason
	reconciles  *prometheus.CounterVec   // by kind and result
	reconcile   *prometheus.HistogramVec // by kind
	markerLag   prometheus.Histogram
	transitions *prometheus.CounterVec // by status: offline
	removed     *prometheus.CounterVec // by kind: lease, marker, sweep
	conflicts   prometheus.Counter
	feedLate    prometheus.Counter
	sweeps      *prometheus.CounterVec // by result: ok, error
	sweepTime   prometheus.Histogram
	leaseEnds   prometheus.Counter
	leaseEnd    prometheus.Histogram
	roomLeaves  prometheus.Counter
	customs     *prometheus.CounterVec // by result: cleared, unchanged, error
}

// The kinds of reconcile work, and their results, as metric labels.
const (
	kindLease   = "lease"
	kindRemoval = "marker"
	kindSweep   = "sweep"

	resultWritten     = "written"
	resultUnchanged   = "unchanged"
	resultUndecodable = "undecodable"
	resultError       = "error"
)

func newReaperMetrics(reg prometheus.Registerer, s *Service) *reaperMetrics {
	f := metrics.NewFactory(reg)
	m := &reaperMetrics{
		markers: f.CounterVec("greendot_reaper_markers_total",
			"Markers seen: of gateway leases that ended (lease_expired, lease_deleted, lease_purged), and of connection keys of the earlier shape (expired, deleted, purged).", "reason"),
		reconciles: f.CounterVec("greendot_reaper_reconciles_total",
			"Reconciles of a user's status record, by kind (lease, marker, sweep) and result (written, unchanged, undecodable: a record not greendot's, left as it is; error).", "kind", "result"),
		reconcile: f.HistogramVec("greendot_reaper_reconcile_seconds",
			"Time to reconcile a user's status record with the end of connections, compare-and-set retries included.",
			metrics.LatencyBuckets, "kind"),
		markerLag: f.Histogram("greendot_reaper_marker_lag_seconds",
			"Time from a marker (a lease's end, or a key's) being written to the reaper having applied it to the status records.",
			metrics.LatencyBuckets),
		transitions: f.CounterVec("greendot_reaper_transitions_total",
			"Status changes the reaper wrote, by the status the user went to: offline.", "status"),
		removed: f.CounterVec("greendot_reaper_connections_removed_total",
			"Connections taken out of status records, by what found them ended: lease, marker, sweep.", "source"),
		leaseEnds: f.Counter("greendot_reaper_lease_ends_total",
			"Gateway leases whose end the reaper applied: every connection held under them ended."),
		leaseEnd: f.Histogram("greendot_reaper_lease_end_seconds",
			"Time to apply the end of a gateway's lease, from its marker's delivery to its connections' keys removed.",
			[]float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
		roomLeaves: f.Counter("greendot_reaper_room_leaves_total",
			"Room memberships the reaper ended (keys in presence_rooms held under leases that ended), each with a leave event."),
		customs: f.CounterVec("greendot_reaper_custom_expiries_total",
			"Ends of custom status timers (presence_timers) the reaper applied, by result: cleared (the custom status expired and was cleared), unchanged (another was set since, or it was cleared already), error (tried again).", "result"),
		conflicts: f.Counter("greendot_reaper_status_conflicts_total",
			"Compare-and-set writes of a status record that lost to another writer and were retried."),
		feedLate: f.Counter("greendot_reaper_feed_late_writes_total",
			"Status writes made after waiting in vain for presence_feed to copy the user's revisions before them, which the feed may skip."),
		sweeps: f.CounterVec("greendot_reaper_sweeps_total",
			"Full sweeps of presence_status against presence_conns, by result: ok, error.", "result"),
		sweepTime: f.Histogram("greendot_reaper_sweep_seconds",
			"Duration of a full sweep.", []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
	}
	f.GaugeFunc("greendot_reaper_queued_tasks",
		"Reconcile tasks waiting for a worker.", func() float64 { return float64(s.queued()) })
	return m
}

// markerReason names why a connection key's marker was written, from its
// headers: an expiry by TTL, a purge (the gateway removing a dead
// connection's key), or a delete.
func markerReason(h nats.Header) string {
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge":
		return "expired"
	case "Remove":
		return "deleted"
	case "Purge":
		return "purged"
	}
	if presence.EntryOp(h) == jetstream.KeyValueDelete {
		return "deleted"
	}
	return "purged"
}

// done records one finished reconcile: its kind, duration, result and the
// status change it made (before and after are the user's true status).
func (m *reaperMetrics) done(kind string, start time.Time, written bool, err error, before, after presence.Status) {
	m.reconcile.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	switch {
	case err != nil:
		m.reconciles.WithLabelValues(kind, resultError).Inc()
		return
	case !written:
		m.reconciles.WithLabelValues(kind, resultUnchanged).Inc()
		return
	}
	m.reconciles.WithLabelValues(kind, resultWritten).Inc()
	m.transition(before, after)
}

// ignored records a reconcile that left an undecodable record as it is.
func (m *reaperMetrics) ignored(kind string, start time.Time) {
	m.reconcile.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	m.reconciles.WithLabelValues(kind, resultUndecodable).Inc()
}

// transition counts a written status change to offline or away.
func (m *reaperMetrics) transition(before, after presence.Status) {
	if before == after {
		return
	}
	if after == presence.Offline {
		m.transitions.WithLabelValues(string(after)).Inc()
	}
}

// swept records one full sweep.
func (m *reaperMetrics) swept(start time.Time, err error) {
	m.sweepTime.Observe(time.Since(start).Seconds())
	if err != nil {
		m.sweeps.WithLabelValues(resultError).Inc()
		return
	}
	m.sweeps.WithLabelValues("ok").Inc()
}

// Registry returns the registry holding the reaper's metrics, which
// --metrics-listen serves on GET /metrics.
func (s *Service) Registry() *prometheus.Registry { return s.reg }

// queued returns how many tasks wait in the workers' queues.
func (s *Service) queued() int { return int(s.queue.Load()) }
