package webhook

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/pkg/metrics"
)

// webhookMetrics are a webhooks process's Prometheus metrics, on the
// Service's own registry.
type webhookMetrics struct {
	revisions   prometheus.Counter
	skipped     *prometheus.CounterVec // by reason
	events      prometheus.Counter
	batches     prometheus.Counter
	attempts    prometheus.Counter
	failures    *prometheus.CounterVec // by reason
	deadLetters prometheus.Counter
	deadEvents  prometheus.Counter
	resyncUsers *prometheus.CounterVec // by result
	lag         prometheus.Histogram
}

// lagBuckets reach from a quick delivery to one that waited out a long
// outage of the endpoint.
var lagBuckets = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600}

func newWebhookMetrics(reg prometheus.Registerer, s *Service) *webhookMetrics {
	f := metrics.NewFactory(reg)
	m := &webhookMetrics{
		revisions: f.Counter("greendot_webhook_revisions_total",
			"Revisions of presence_status received."),
		skipped: f.CounterVec("greendot_webhook_revisions_skipped_total",
			"Revisions acknowledged without an event, by reason: no transition (unchanged: same status, devices, last_seen and custom status as the user's revision before), not for this endpoint (filtered: a user or a kind of change its filters leave out), or not greendot's (invalid_key, undecodable).", "reason"),
		events: f.Counter("greendot_webhook_events_delivered_total",
			"Events delivered: in a batch the endpoint answered with 2xx."),
		batches: f.Counter("greendot_webhook_batches_delivered_total",
			"Batches the endpoint answered with 2xx."),
		attempts: f.Counter("greendot_webhook_attempts_total",
			"POSTs sent to the endpoint, retries included."),
		failures: f.CounterVec("greendot_webhook_failures_total",
			"Attempts that failed, by reason: timeout, network, http_429, http_5xx, http_4xx (refused for good, but for 408, which is tried again), http_other (1xx, 3xx).", "reason"),
		deadLetters: f.Counter("greendot_webhook_dead_letters_total",
			"Batches given up: refused for good (4xx other than 408 and 429) or failing for longer than --give-up-after. Their users and revisions are logged."),
		deadEvents: f.Counter("greendot_webhook_dead_letter_events_total",
			"Events in the batches given up."),
		resyncUsers: f.CounterVec("greendot_webhook_resync_users_total",
			"Users of dead-lettered batches, by what became of them: sent (their current state delivered), superseded (a newer event of theirs delivered first), gone (no record to send), given_up (their current state still not delivered --give-up-after after their last dead letter), overflow (not remembered: the process remembered as many as it may), taken_over (remembered from presence_webhook_resync, where an earlier process, or another of the consumer's, kept them).", "result"),
		lag: f.Histogram("greendot_webhook_lag_seconds",
			"Time from a status record being written to the endpoint acknowledging its event.", lagBuckets),
	}
	f.GaugeFunc("greendot_webhook_cached_users",
		"Users whose last sent state this process remembers, to skip revisions that change nothing.",
		func() float64 { return float64(s.cached.Load()) })
	f.GaugeFunc("greendot_webhook_resync_pending_users",
		"Users of dead-lettered batches remembered, whose current state is yet to be delivered.",
		func() float64 { return float64(s.resync.pending.Load()) })
	f.GaugeFunc("greendot_webhook_held_revisions",
		"Revisions held back because revisions before them are pending with another process (one that died): they go once those come again or are acknowledged.",
		func() float64 { return float64(s.order.held.Load()) })
	return m
}
