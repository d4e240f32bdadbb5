package gateway

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/protocol"
)

// gatewayMetrics are the gateway's Prometheus metrics. Each Service has its
// own registry, so that several gateways can run in one process (tests,
// standalone mode).
type gatewayMetrics struct {
	upgrades      *prometheus.CounterVec // by result: accepted, or the refusal reason
	compressed    prometheus.Counter     // upgrades accepted with permessage-deflate
	msgsIn        *prometheus.CounterVec // by type
	msgsOut       *prometheus.CounterVec // by type
	closed        *prometheus.CounterVec // by reason
	kvWrites      *prometheus.CounterVec // by kind: create, update, status, remove
	kvErrors      *prometheus.CounterVec // by kind
	kvLatency     *prometheus.HistogramVec
	propagation   prometheus.Histogram
	slowCloses    prometheus.Counter
	stalls        prometheus.Counter
	writeErrors   atomic.Int64
	heartbeats    prometheus.Counter
	eventsIn      prometheus.Counter
	eventsDropped prometheus.Counter
	memoryTrims   prometheus.Counter

	statusConflicts prometheus.Counter
	feedLate        prometheus.Counter
	kicks           prometheus.Counter
	apiLimited      *prometheus.CounterVec // by what was over its limit: identity, address, key
	serverAPI       *prometheus.CounterVec // by key and status code
	eventsOut       prometheus.Counter
	leaseRefreshes  prometheus.Counter
	leasesLost      prometheus.Counter
	reregistered    prometheus.Counter
	roomFrames      *prometheus.CounterVec // by type: room_state, room_diff, room_denied
	natsDrops       *prometheus.CounterVec // by kind: event, self, room_event, room_signal

	// The app policy: questions to the app, by transport (http, nats),
	// those that failed, their latency, look-ups of the cache of its
	// answers (hit, miss), and invalidations received.
	callouts      *prometheus.CounterVec
	calloutErrors *prometheus.CounterVec
	calloutTime   *prometheus.HistogramVec
	cacheHits     prometheus.Counter
	cacheMisses   prometheus.Counter
	invalidations *prometheus.CounterVec // by result: applied, invalid
	// connectProxyAnswers counts the connect proxy's answers by type
	// (connect, refresh) and result (allowed, refused, failed);
	// connectProxyTime times its questions by transport.
	connectProxyAnswers *prometheus.CounterVec
	connectProxyTime    *prometheus.HistogramVec

	// heartbeatMsgs is msgsIn for heartbeats, sentSelf and sentBatch
	// msgsOut for the scheduler's frames, and sentRoomDiff and
	// sentRoomSignal roomFrames for its room frames, resolved once: the
	// heartbeat and delivery paths do not allocate.
	heartbeatMsgs, sentSelf, sentBatch prometheus.Counter
	sentRoomDiff, sentRoomSignal       prometheus.Counter
}

func newGatewayMetrics(reg prometheus.Registerer, s *Service) *gatewayMetrics {
	f := metrics.NewFactory(reg)
	m := &gatewayMetrics{
		upgrades: f.CounterVec("greendot_gateway_upgrades_total",
			"WebSocket upgrade requests, by result: accepted, or the reason they were refused.", "result"),
		compressed: f.Counter("greendot_gateway_upgrades_compressed_total",
			"WebSocket upgrades accepted with permessage-deflate (RFC 7692) negotiated."),
		msgsIn: f.CounterVec("greendot_gateway_messages_received_total",
			"Client messages received, by type.", "type"),
		msgsOut: f.CounterVec("greendot_gateway_messages_sent_total",
			"Frames sent to clients, by type.", "type"),
		closed: f.CounterVec("greendot_gateway_connections_closed_total",
			"Connections closed, by reason.", "reason"),
		kvWrites: f.CounterVec("greendot_gateway_kv_writes_total",
			"Writes to presence_conns and presence_status, by kind: create, update, remove (connection keys), status (status records).", "kind"),
		kvErrors: f.CounterVec("greendot_gateway_kv_errors_total",
			"Failed writes, by kind: create, update, remove, status, and lease (the gateway's lease).", "kind"),
		kvLatency: f.HistogramVec("greendot_gateway_kv_seconds",
			"Latency of KV operations the gateway waits for, by operation.", metrics.LatencyBuckets, "op"),
		propagation: f.Histogram("greendot_gateway_propagation_seconds",
			"Time from a status record being written to the presence_batch frame carrying it being written to a watcher's socket.", metrics.LatencyBuckets),
		slowCloses: f.Counter("greendot_gateway_slow_socket_closes_total",
			"Sockets closed because they could not take frames in time."),
		stalls: f.Counter("greendot_gateway_socket_stalls_total",
			"Times a socket did not take a frame whole, and its frames began to wait for the kernel to take them."),
		heartbeats: f.Counter("greendot_gateway_heartbeats_total",
			"Heartbeat messages and pings received."),
		eventsIn: f.Counter("greendot_gateway_events_received_total",
			"Presence and self events received from NATS."),
		eventsDropped: f.Counter("greendot_gateway_events_dropped_total",
			"Events dropped because they were not newer than what watchers already had."),
		memoryTrims: f.Counter("greendot_gateway_memory_trims_total",
			"Times the quiet gateway collected and gave its process's free memory back to the operating system (--memory-trim-interval)."),
		statusConflicts: f.Counter("greendot_gateway_status_conflicts_total",
			"Compare-and-set writes of a status record that lost to another writer and were retried."),
		feedLate: f.Counter("greendot_gateway_feed_late_writes_total",
			"Status writes made after waiting in vain for presence_feed to copy the user's revisions before them, which the feed may skip."),
		kicks: f.Counter("greendot_gateway_kicks_total",
			"Connections closed by an operator's kick (greendot.gateway.kick)."),
		apiLimited: f.CounterVec("greendot_gateway_api_rate_limited_total",
			"HTTP API requests answered 429, by the limit they were over: identity, address, or key (the server API's).", "by"),
		serverAPI: f.CounterVec("greendot_gateway_server_api_requests_total",
			"Server API requests (/api/server/), by the API key's name (empty when none was given or known) and the answer's status code.", "key", "code"),
		eventsOut: f.Counter("greendot_gateway_events_published_total",
			"Presence and self events the gateway published for the status writes it made."),
		leaseRefreshes: f.Counter("greendot_gateway_lease_refreshes_total",
			"Writes of the gateway's lease (about one a second)."),
		leasesLost: f.Counter("greendot_gateway_leases_lost_total",
			"Times the gateway found its lease ended while it ran (NATS lost for longer than the lease TTL, or an operator deleted it)."),
		reregistered: f.Counter("greendot_gateway_connections_reregistered_total",
			"Connections registered again under a new lease after the gateway's lease was lost."),
		callouts: f.CounterVec("greendot_gateway_authz_callouts_total",
			"Questions asked of the app under the app policy, by transport: http or nats.", "transport"),
		calloutErrors: f.CounterVec("greendot_gateway_authz_callout_errors_total",
			"Questions to the app that got no good answer (timeout, error, bad answer), by transport; what they asked about was refused.", "transport"),
		calloutTime: f.HistogramVec("greendot_gateway_authz_callout_seconds",
			"Time to answer a question to the app, retries included, by transport.", metrics.LatencyBuckets, "transport"),
		connectProxyAnswers: f.CounterVec("greendot_gateway_connect_proxy_answers_total",
			"Questions to the connect proxy, by type (connect: an upgrade; refresh: a session before its expiry) and result: allowed, refused (the app refused the client, or ended the session), or failed (no good answer in time).", "type", "result"),
		connectProxyTime: f.HistogramVec("greendot_gateway_connect_proxy_seconds",
			"Time to answer a question to the connect proxy, retries included, by transport: http or nats.", metrics.LatencyBuckets, "transport"),
		invalidations: f.CounterVec("greendot_gateway_authz_invalidations_total",
			"Invalidations of the app's answers received on greendot.authz.invalidate, by result: applied, or invalid (not understood, dropped).", "result"),
	}
	cache := f.CounterVec("greendot_gateway_authz_cache_lookups_total",
		"Look-ups of the app's cached answers, by result: hit, or miss (the app is asked).", "result")
	m.cacheHits, m.cacheMisses = cache.WithLabelValues("hit"), cache.WithLabelValues("miss")
	m.roomFrames = f.CounterVec("greendot_gateway_room_frames_total",
		"Room frames written to sockets, by type: room_state, room_diff, room_denied, room_signal.", "type")
	m.sentRoomDiff = m.roomFrames.WithLabelValues(protocol.TypeRoomDiff)
	m.sentRoomSignal = m.roomFrames.WithLabelValues(protocol.TypeRoomSignal)
	m.natsDrops = f.CounterVec("greendot_gateway_nats_drops_total",
		"Times NATS dropped messages of a subscription because the gateway fell behind (a slow consumer), by kind: event (a watched user's state is read again), self (the gateway's users' own states are read again), room_event (the room is listed again), room_signal (lost).", "kind")
	f.GaugeFunc("greendot_gateway_rooms",
		"Rooms with a member connected to this gateway (a member table and two NATS subscriptions each).", func() float64 { return float64(s.rooms.len()) })
	f.GaugeFunc("greendot_gateway_room_memberships",
		"Rooms joined by this gateway's connections, one per connection and room.",
		func() float64 { return float64(s.members.count.Load()) })
	m.heartbeatMsgs = m.msgsIn.WithLabelValues(protocol.TypeHeartbeat)
	m.sentSelf = m.msgsOut.WithLabelValues(protocol.TypeSelf)
	m.sentBatch = m.msgsOut.WithLabelValues(protocol.TypePresenceBatch)
	f.CounterFunc("greendot_gateway_write_errors_total",
		"Writes to client sockets that failed (the socket is then closed).", func() float64 { return float64(m.writeErrors.Load()) })
	f.GaugeFunc("greendot_gateway_connections",
		"Live WebSocket connections.", func() float64 { return float64(s.registry.len()) })
	f.GaugeFunc("greendot_gateway_watched_users",
		"Users watched by at least one socket of this gateway (NATS subscriptions on presence.event.<user>).",
		func() float64 { return float64(s.hub.Len()) })
	f.GaugeFunc("greendot_gateway_stalled_sockets",
		"Sockets whose peers read slower than they are written to: frames wait for the kernel to take them, and their changes coalesce meanwhile.",
		func() float64 { return float64(s.sockets.stalls.len()) })
	f.GaugeFunc("greendot_gateway_pending_deliveries",
		"Sockets with changes waiting for the next batch.", func() float64 { return float64(s.scheduler.Pending()) })
	f.GaugeFunc("greendot_gateway_kv_writes_in_flight",
		"Asynchronous connection key writes (idle or active again) waiting for their acknowledgement.", func() float64 {
			if r := s.opened.Load(); r != nil {
				return float64(r.inFlight())
			}
			return 0
		})
	f.GaugeFunc("greendot_gateway_closing_connections",
		"Cleanly closed connections living out the offline grace.", func() float64 {
			if r := s.opened.Load(); r != nil {
				return float64(r.closing())
			}
			return 0
		})
	f.GaugeFunc("greendot_gateway_lease_age_seconds",
		"Time since the gateway's lease was last confirmed; 0 when none is held.", func() float64 {
			if r := s.opened.Load(); r != nil {
				return r.lease.age().Seconds()
			}
			return 0
		})
	return m
}

// closes counts a closed connection.
func (m *gatewayMetrics) closes(kind endKind, code ws.StatusCode) {
	reason := "clean"
	switch {
	case kind == endDead:
		reason = "dead"
	case kind == endFailed:
		reason = "failed"
	case code != 0 && code != ws.StatusNormalClosure:
		reason = "code_" + strconv.Itoa(int(code))
	}
	m.closed.WithLabelValues(reason).Inc()
}

// callout records a question to the app (callout.Observer).
func (m *gatewayMetrics) callout(transport string, took time.Duration, err error) {
	m.callouts.WithLabelValues(transport).Inc()
	m.calloutTime.WithLabelValues(transport).Observe(took.Seconds())
	if err != nil {
		m.calloutErrors.WithLabelValues(transport).Inc()
	}
}

// connectProxyCall times a question to the connect proxy
// (callout.Observer).
func (m *gatewayMetrics) connectProxyCall(transport string, took time.Duration, _ error) {
	m.connectProxyTime.WithLabelValues(transport).Observe(took.Seconds())
}

// connectProxyAnswer counts an answer of the connect proxy.
func (m *gatewayMetrics) connectProxyAnswer(typ, result string) {
	m.connectProxyAnswers.WithLabelValues(typ, result).Inc()
}

// cacheLookup records a look-up of the app's cached answers.
func (m *gatewayMetrics) cacheLookup(hit bool) {
	if hit {
		m.cacheHits.Inc()
	} else {
		m.cacheMisses.Inc()
	}
}
