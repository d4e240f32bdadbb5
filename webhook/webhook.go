package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/greendot/greendot/internal/durable"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
)

// PriorityGroup is the priority group of every webhooks consumer: the
// server pins it to one client, the process that serves the endpoint,
// and hands it to another when that one stops pulling.
const PriorityGroup = "webhooks"

// Service is a webhooks process: it consumes the revisions of
// presence_status, as the stream presence_feed keeps them, through a
// durable consumer and POSTs the transitions they make to one endpoint.
type Service struct {
	nc       *nats.Conn
	cfg      Config
	log      *slog.Logger
	consumer *durable.Consumer
	client   *http.Client
	limiter  *rate.Limiter
	filter   filter
	js       atomic.Pointer[jetstream.JetStream]
	// store reads the users' current records for resync; nil before the
	// buckets are open.
	store atomic.Pointer[presence.Store]
	// pin is the id the server last pinned this process with, as its
	// messages carry it; nil before the first. repinned says it changed
	// since work last looked: this process was handed the consumer.
	pin      atomic.Pointer[string]
	repinned atomic.Bool

	// order holds back revisions received ahead of some that a process
	// which died held, and passes them on in the order of the stream.
	order order
	// last holds, per user, the newest revision handled and what it said.
	// It is touched only under order.mu.
	last   map[string]sent
	cached atomic.Int64

	// in carries the events handle took, in the order of the stream, to
	// work, which batches and delivers them.
	in chan *item
	// held are the revisions handed to work and not yet acknowledged,
	// handed back or given up: those a delivery under way keeps alive.
	held held
	// resync remembers the users of dead-lettered batches until their
	// current state is delivered (see resync.go), and resyncKV keeps them
	// (presence_webhook_resync), bound by prepare before work starts.
	// Only work touches them.
	resync   resync
	resyncKV jetstream.KeyValue
	// quit is closed when the process starts stopping: a delivery under
	// way is abandoned and its revisions handed back.
	quit     chan struct{}
	quitting context.Context
	stop     context.CancelFunc

	reg     *prometheus.Registry
	metrics *webhookMetrics
}

// sent is what a process last handled of a user.
type sent struct {
	rev   uint64
	state state
}

// item is one revision to deliver.
type item struct {
	msg jetstream.Msg
	seq uint64 // in presence_feed
	ev  Event
}

// maxCached bounds how many users' last states are remembered; when full
// the memory is cleared, which costs at most one event per user that
// repeats the state before it.
const maxCached = 1_000_000

// New validates cfg and returns a webhooks process that will use nc. It
// starts no goroutines and does no I/O. The caller owns nc.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	quitting, stop := context.WithCancel(context.Background())
	s := &Service{
		nc:  nc,
		cfg: cfg,
		log: cfg.Logger.With("svc", "webhooks", "consumer", cfg.Consumer),
		client: &http.Client{
			Timeout: cfg.Timeout,
			// A redirect is answered like any other status that is not
			// 2xx: the endpoint's URL is the one configured.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		limiter:  rate.NewLimiter(rate.Limit(cfg.RateLimit), 1),
		filter:   filter{users: cfg.Users, events: cfg.Events},
		held:     held{msgs: make(map[jetstream.Msg]struct{})},
		order:    newOrder(),
		last:     make(map[string]sent),
		in:       make(chan *item, cfg.BatchSize),
		resync:   newResync(maxResync, cfg.BatchSize),
		quitting: quitting,
		stop:     stop,
		reg:      metrics.NewRegistry(),
	}
	s.quit = make(chan struct{})
	context.AfterFunc(quitting, func() { close(s.quit) })
	s.metrics = newWebhookMetrics(s.reg, s)
	consumer, err := durable.New(nc, durable.Config{
		Name:    "webhooks",
		Logger:  s.log,
		Buckets: cfg.Buckets,
		Bucket:  presence.StatusBucket,
		Stream:  presence.FeedStream,
		Consumer: jetstream.ConsumerConfig{
			Durable:       cfg.Consumer,
			Description:   "greendot webhooks: status transitions POSTed to " + cfg.redactedURL(),
			FilterSubject: presence.KeySubject(presence.StatusBucket, ">"),
			DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.AckWait,
			MaxDeliver:    -1,
			// One batch handed out at a time: the next revisions are
			// handed out once the batch before them is acknowledged, so
			// a user's events go out in the order of their revisions.
			MaxAckPending:  cfg.BatchSize,
			PriorityPolicy: jetstream.PriorityPolicyPinned,
			PriorityGroups: []string{PriorityGroup},
			PinnedTTL:      cfg.PinnedTTL,
		},
		PullMaxMessages: cfg.BatchSize,
		// The pinned process pulls again at least every PinnedTTL/3 while
		// it runs, so it keeps the pin even while a batch is retried.
		PullOptions: []jetstream.PullConsumeOpt{
			jetstream.PullPriorityGroup(PriorityGroup),
			jetstream.PullExpiry(max(cfg.PinnedTTL/3, time.Second)),
		},
		Admin:    s.adminConfig(),
		NotReady: ErrNotReady,
		Opened: func(store *presence.Store) {
			js := store.JetStream()
			s.js.Store(&js)
			s.store.Store(store)
		},
		Prepare: s.prepare,
		Work:    s.work,
		Handle:  s.handle,
		Loops:   []func(context.Context){s.watchStop, s.hold},
	})
	if err != nil {
		stop()
		return nil, err
	}
	s.consumer = consumer
	return s, nil
}

// Run consumes status revisions and delivers their transitions until ctx
// is canceled; then it abandons the delivery under way, hands back the
// revisions it holds, in order, so that another process (or the next
// start) delivers them, and returns nil. It returns an error only when the
// process cannot start; one that wraps presence.ErrFeedNotFound when the
// stream presence_feed does not exist.
func (s *Service) Run(ctx context.Context) error {
	defer s.stop()
	err := s.consumer.Run(ctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("webhooks: %w", presence.ErrFeedNotFound)
	}
	return err
}

// Registry returns the registry holding the process's metrics, which
// --metrics-listen serves on GET /metrics.
func (s *Service) Registry() *prometheus.Registry { return s.reg }

// watchStop runs beside consuming: when the process starts stopping it
// ends the delivery under way, before the consumer is drained.
func (s *Service) watchStop(ctx context.Context) {
	<-ctx.Done()
	s.stop()
}

var statusSubjectPrefix = presence.KeySubject(presence.StatusBucket, "")

// pinIDHeader carries, on every message the server hands the pinned
// process, the id it pinned that process with.
const pinIDHeader = "Nats-Pin-Id"

// handle takes one revision, in the order of the stream (see take): a
// transition is handed to work; anything else is acknowledged.
func (s *Service) handle(msg jetstream.Msg) {
	s.metrics.revisions.Inc()
	if id := msg.Headers().Get(pinIDHeader); id != "" {
		if p := s.pin.Load(); p == nil || *p != id {
			s.pin.Store(&id)
			s.repinned.Store(true)
		}
	}
	meta, err := msg.Metadata()
	if err != nil {
		s.metrics.skipped.WithLabelValues("undecodable").Inc()
		s.log.Error("ignoring revision without metadata", "subject", msg.Subject(), "err", err)
		_ = msg.Ack()
		return
	}
	s.take(msg, meta)
}

// decode returns the revision's event, or nil when there is nothing to
// deliver: not a user's key, undecodable, or no transition. It is called
// with order.mu held, in the order of the stream.
func (s *Service) decode(msg jetstream.Msg, meta *jetstream.MsgMetadata) *item {
	userID := strings.TrimPrefix(msg.Subject(), statusSubjectPrefix)
	if !presence.ValidUserID(userID) {
		s.metrics.skipped.WithLabelValues("invalid_key").Inc()
		s.log.Warn("ignoring status key that is not a user id", "subject", msg.Subject())
		return nil
	}
	// The revision is presence_status's sequence, which the feed keeps in
	// the header of the message it sourced.
	rev, ok := presence.FeedRevision(msg.Headers())
	if !ok {
		s.metrics.skipped.WithLabelValues("undecodable").Inc()
		s.log.Error("ignoring feed message without its presence_status revision", "subject", msg.Subject(), "seq", meta.Sequence.Stream)
		return nil
	}
	var rec *presence.Record
	if presence.EntryOp(msg.Headers()) == jetstream.KeyValuePut {
		rec = new(presence.Record)
		if err := json.Unmarshal(msg.Data(), rec); err != nil {
			s.metrics.skipped.WithLabelValues("undecodable").Inc()
			s.log.Warn("ignoring undecodable status record", "user_id", userID, "rev", rev, "err", err)
			return nil
		}
	}
	if !s.filter.user(userID) {
		s.metrics.skipped.WithLabelValues("filtered").Inc()
		return nil
	}
	ev := EventOf(userID, rec, rev, meta.Timestamp.UnixMilli(), s.cfg.Invisible)

	// A revision delivered before (its process stopped, or let its
	// acknowledgement wait pass) goes out again whatever this process
	// remembers: the receiver drops it if it had it.
	last, known := s.last[userID]
	if known && rev > last.rev && meta.NumDelivered == 1 {
		switch st := ev.state(); {
		case st == last.state:
			s.metrics.skipped.WithLabelValues("unchanged").Inc()
			s.last[userID] = sent{rev: rev, state: last.state}
			return nil
		case !s.filter.change(last.state, st):
			s.metrics.skipped.WithLabelValues("filtered").Inc()
			s.last[userID] = sent{rev: rev, state: st}
			return nil
		}
	}
	if len(s.last) >= maxCached {
		clear(s.last)
	}
	if !known || rev > last.rev {
		s.last[userID] = sent{rev: rev, state: ev.state()}
	}
	s.cached.Store(int64(len(s.last)))
	return &item{msg: msg, seq: meta.Sequence.Stream, ev: ev}
}

// work gathers the events handle takes into batches and delivers them, one
// at a time, with the rounds that send dead-lettered users' current state
// in between, until the process stops; then it hands back, in the order
// they came, the revisions of the batch under way and every one handle
// still passes it, until ctx is canceled once the consumer is drained.
func (s *Service) work(ctx context.Context) {
	stopProgress := s.keepInProgress()
	defer stopProgress()
	for {
		// Handed the consumer, this process takes over the users the
		// one before it kept.
		if s.repinned.Swap(false) {
			s.reloadResync()
		}
		batch, ok := s.collect()
		if !ok {
			break
		}
		if batch != nil && !s.deliver(batch) {
			s.handBack(batch)
			break
		}
		// A round goes after every batch while one is due, so that
		// neither holds the other up for long.
		if !s.resyncRound() {
			break
		}
	}
	s.abandonResync()
	for {
		select {
		case it := <-s.in:
			s.handBack([]*item{it})
		case <-ctx.Done():
			for {
				select {
				case it := <-s.in:
					s.handBack([]*item{it})
				default:
					s.unpin()
					return
				}
			}
		}
	}
}

// collect waits for an event, then for more until BatchSize are there or
// BatchWait has passed, and returns them. It returns no batch, but ok, when
// a resync round falls due before the first event comes (an event that is
// there already goes first), and ok false when the process stops first;
// the events it held are handed back.
func (s *Service) collect() (batch []*item, ok bool) {
	select {
	case it := <-s.in:
		batch = append(batch, it)
	default:
		due, stop := s.resyncDue()
		select {
		case it := <-s.in:
			batch = append(batch, it)
		case <-due:
			stop()
			return nil, true
		case <-s.quit:
			stop()
			return nil, false
		}
		stop()
	}
	t := time.NewTimer(s.cfg.BatchWait)
	defer t.Stop()
	for len(batch) < s.cfg.BatchSize {
		select {
		case it := <-s.in:
			batch = append(batch, it)
		case <-t.C:
			return batch, true
		case <-s.quit:
			s.handBack(batch)
			return nil, false
		}
	}
	return batch, true
}

// handBack asks the server to hand the revisions out again at once, in
// their order.
func (s *Service) handBack(batch []*item) {
	for _, it := range batch {
		s.settle(it.seq)
		_ = it.msg.Nak()
		s.held.remove(it.msg)
	}
}

// held is a set of messages, safe for concurrent use.
type held struct {
	mu   sync.Mutex
	msgs map[jetstream.Msg]struct{}
}

func (h *held) add(m jetstream.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs[m] = struct{}{}
}

func (h *held) remove(m jetstream.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.msgs, m)
}

func (h *held) list() []jetstream.Msg {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]jetstream.Msg, 0, len(h.msgs))
	for m := range h.msgs {
		out = append(out, m)
	}
	return out
}

// unpin lets another process take the consumer over at once rather than
// after PinnedTTL, if it is pinned to this one: a process that does not
// serve leaves the one that does where it is.
func (s *Service) unpin() {
	js, pin := s.js.Load(), s.pin.Load()
	if js == nil || pin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stream, err := (*js).Stream(ctx, presence.FeedStream)
	var cons jetstream.Consumer
	if err == nil {
		cons, err = stream.Consumer(ctx, s.cfg.Consumer)
	}
	if err == nil {
		if pinnedTo(cons.CachedInfo()) != *pin {
			return
		}
		err = stream.UnpinConsumer(ctx, s.cfg.Consumer, PriorityGroup)
	}
	if err != nil {
		s.log.Debug("unpin the consumer", "err", err)
	}
}

// pinnedTo returns the id of the process the consumer is pinned to, or ""
// when none.
func pinnedTo(info *jetstream.ConsumerInfo) string {
	for _, g := range info.PriorityGroups {
		if g.Group == PriorityGroup {
			return g.PinnedClientID
		}
	}
	return ""
}
