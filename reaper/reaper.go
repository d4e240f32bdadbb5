package reaper

import (
	"context"
	"encoding/json"
	"errors"
	"hash/maphash"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/internal/durable"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
)

// Service is a reaper instance.
type Service struct {
	cfg      Config
	log      *slog.Logger
	consumer *durable.Consumer
	// store is set once Run has opened the buckets.
	store *presence.Store

	timers  *timers
	workers []chan task
	seed    maphash.Seed

	reg     *prometheus.Registry
	metrics *reaperMetrics
	// queue counts the tasks dispatched and not yet taken by a worker.
	queue atomic.Int64
	// sweepMu keeps sweeps (periodic and on request) one at a time.
	sweepMu sync.Mutex
}

// task is a piece of work for one user, run by the worker that owns the user.
type task struct {
	userID, connID string
	// removedAt is the revision of a removal marker; zero for an
	// inactivity check.
	removedAt uint64
	// msg is acknowledged when the task is done, if not nil.
	msg jetstream.Msg
	// markedAt is when the removal marker was written.
	markedAt time.Time
}

// New validates cfg and returns a reaper that will use nc. It starts no
// goroutines and does no I/O. The caller owns nc.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{
		cfg:     cfg,
		log:     cfg.Logger.With("svc", "reaper"),
		timers:  newTimers(),
		workers: make([]chan task, cfg.Workers),
		seed:    maphash.MakeSeed(),
		reg:     metrics.NewRegistry(),
	}
	for i := range s.workers {
		s.workers[i] = make(chan task, 256)
	}
	s.metrics = newReaperMetrics(s.reg, s)
	consumer, err := durable.New(nc, durable.Config{
		Name:    "reaper",
		Logger:  s.log,
		Buckets: cfg.Buckets,
		Bucket:  presence.ConnsBucket,
		Consumer: jetstream.ConsumerConfig{
			Durable:       presence.ReaperConsumer,
			Description:   "greendot reaper: ended connections to offline, inactive ones to away",
			FilterSubject: presence.KeySubject(presence.ConnsBucket, ">"),
			DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.AckWait,
			MaxAckPending: 20_000,
		},
		PullMaxMessages: 2000,
		Admin:           s.adminConfig(),
		NotReady:        ErrNotReady,
		Opened:          s.opened,
		Prepare:         s.startupSweep,
		Work:            s.work,
		Handle:          s.handle,
		Loops:           []func(context.Context){s.timerLoop, s.sweepLoop},
	})
	if err != nil {
		return nil, err
	}
	s.consumer = consumer
	return s, nil
}

// Run reaps until ctx is canceled, then stops consuming, lets the workers
// finish what they hold, and returns nil. It returns an error only when
// the reaper cannot start.
func (s *Service) Run(ctx context.Context) error {
	return s.consumer.Run(ctx)
}

// opened keeps the store Run opened.
func (s *Service) opened(store *presence.Store) {
	s.store = store
	store.OnConflict(s.metrics.conflicts.Inc)
}

var connSubjectPrefix = presence.KeySubject(presence.ConnsBucket, "")

// handle takes one message of the connection stream.
func (s *Service) handle(msg jetstream.Msg) {
	key := strings.TrimPrefix(msg.Subject(), connSubjectPrefix)
	userID, connID, ok := presence.SplitConnKey(key)
	if !ok {
		_ = msg.Ack()
		return
	}
	if presence.EntryOp(msg.Headers()) == jetstream.KeyValuePut {
		var rec presence.ConnRecord
		if err := json.Unmarshal(msg.Data(), &rec); err == nil {
			s.schedule(key, &rec)
		}
		_ = msg.Ack()
		return
	}
	s.metrics.markers.WithLabelValues(markerReason(msg.Headers())).Inc()
	meta, err := msg.Metadata()
	if err != nil {
		s.log.Error("removal metadata", "subject", msg.Subject(), "err", err)
		_ = msg.Ack()
		return
	}
	s.timers.clear(key)
	s.dispatch(task{userID: userID, connID: connID, removedAt: meta.Sequence.Stream, msg: msg, markedAt: meta.Timestamp})
}

// schedule sets or clears a connection's inactivity timer from its record.
func (s *Service) schedule(key string, rec *presence.ConnRecord) {
	if rec.Idle || rec.Closing || rec.AwayAt == 0 {
		s.timers.clear(key)
		return
	}
	s.timers.set(key, rec.AwayAt)
}

func (s *Service) dispatch(t task) {
	var h maphash.Hash
	h.SetSeed(s.seed)
	_, _ = h.WriteString(t.userID)
	s.queue.Add(1)
	s.workers[h.Sum64()%uint64(len(s.workers))] <- t
}

// work runs the workers until ctx is canceled, then lets each finish the
// tasks queued for it. Tasks run on a context that is not canceled, so
// that a removal handed out before the drain is applied.
func (s *Service) work(ctx context.Context) {
	tctx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, ch := range s.workers {
		wg.Go(func() {
			for {
				select {
				case t := <-ch:
					s.do(tctx, t)
				case <-ctx.Done():
					for {
						select {
						case t := <-ch:
							s.do(tctx, t)
						default:
							return
						}
					}
				}
			}
		})
	}
	wg.Wait()
}

// do runs one task and acknowledges its message, or hands it back.
func (s *Service) do(ctx context.Context, t task) {
	s.queue.Add(-1)
	var err error
	if t.removedAt != 0 {
		err = s.remove(ctx, t.userID, t.connID, t.removedAt)
		if err == nil {
			s.metrics.markerLag.Observe(time.Since(t.markedAt).Seconds())
		}
	} else {
		err = s.checkInactive(ctx, t.userID, t.connID)
	}
	switch {
	case err != nil && t.msg != nil:
		s.log.Error("reconcile", "user_id", t.userID, "conn_id", t.connID, "err", err)
		_ = t.msg.NakWithDelay(time.Second)
	case err != nil:
		s.log.Error("reconcile", "user_id", t.userID, "conn_id", t.connID, "err", err)
	case t.msg != nil:
		_ = t.msg.Ack()
	}
}

// remove applies the end of a connection, seen as a removal marker at
// revision markerRev: it leaves the user's record if the record's
// connection was created after the marker (its gateway made it again).
func (s *Service) remove(ctx context.Context, userID, connID string, markerRev uint64) error {
	start := time.Now()
	var before presence.Status
	rec, _, written, err := s.store.UpdateStatus(ctx, userID, func(r *presence.Record) error {
		before = r.Status
		c, ok := r.Conns[connID]
		if !ok || c.Rev >= markerRev {
			return presence.ErrNoChange
		}
		delete(r.Conns, connID)
		return nil
	})
	s.metrics.done(kindRemoval, start, written, err, before, rec.Status)
	if err != nil {
		return err
	}
	if written && s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.LogAttrs(ctx, slog.LevelDebug, "connection ended", slog.String("user_id", userID),
			slog.String("conn_id", connID), slog.String("status", string(rec.Status)))
	}
	return nil
}

// checkInactive marks a connection idle if its key, read from the stream
// leader after the status record, still says it is past its away_at.
func (s *Service) checkInactive(ctx context.Context, userID, connID string) error {
	var later int64
	start := time.Now()
	var before presence.Status
	rec, _, written, err := s.store.UpdateStatus(ctx, userID, func(r *presence.Record) error {
		later = 0
		before = r.Status
		c, ok := r.Conns[connID]
		if !ok || c.Idle || c.Closing {
			return presence.ErrNoChange
		}
		cr, _, err := s.store.Conn(ctx, userID, connID)
		if errors.Is(err, presence.ErrNotFound) {
			return presence.ErrNoChange // its removal is on the way
		}
		if err != nil {
			return err
		}
		if cr.Idle || cr.Closing || cr.AwayAt == 0 {
			return presence.ErrNoChange
		}
		if cr.AwayAt > s.cfg.Now().UnixMilli() {
			later = cr.AwayAt
			return presence.ErrNoChange
		}
		c.Idle = true
		r.Conns[connID] = c
		return nil
	})
	s.metrics.done(kindInactivity, start, written, err, before, rec.Status)
	if err != nil {
		return err
	}
	if later != 0 {
		s.timers.set(presence.ConnKey(userID, connID), later)
	}
	if written && s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.LogAttrs(ctx, slog.LevelDebug, "connection inactive", slog.String("user_id", userID),
			slog.String("conn_id", connID), slog.String("status", string(rec.Status)))
	}
	return nil
}

func (s *Service) timerLoop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		keys, next := s.timers.due(s.cfg.Now())
		for _, key := range keys {
			if userID, connID, ok := presence.SplitConnKey(key); ok {
				select {
				case <-ctx.Done():
					return
				default:
				}
				s.dispatch(task{userID: userID, connID: connID})
			}
		}
		if next < 0 {
			next = time.Hour
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.timers.wake:
		}
	}
}

// startupSweep runs the first sweep, again after a failure, until one
// finishes or ctx is canceled. The reaper is not ready before: whoever
// waits for it to be ready does not race a sweep that still removes
// connections.
func (s *Service) startupSweep(ctx context.Context) error {
	wait := 100 * time.Millisecond
	for {
		_, err := s.runSweep(ctx)
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Error("start-up sweep", "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, s.cfg.SweepInterval)
	}
}

// sweepLoop sweeps every SweepInterval after the start-up sweep.
func (s *Service) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.runSweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("sweep", "err", err)
		}
	}
}

// sweep removes connections whose keys are gone without a marker this
// reaper saw, and reschedules every live connection's inactivity timer.
//
// It reads every status record first, then lists the live connection keys.
// A connection in a record read before the listing and absent from the
// listing is a candidate: the listing is not a snapshot (a key refreshed
// while it runs can be missed), so each candidate's key is read from the
// stream leader after the record, inside the compare-and-set, and only a
// key that is gone removes the connection. If its gateway created the key
// again meanwhile, the record's Rev for it changed, and it is left alone.
func (s *Service) sweep(ctx context.Context) (int, error) {
	type seen struct {
		userID string
		conns  map[string]uint64 // conn id -> Rev
	}
	var records []seen
	err := s.store.ScanStatus(ctx, func(userID string, rec presence.Record, _ uint64) error {
		if len(rec.Conns) == 0 {
			return nil
		}
		m := make(map[string]uint64, len(rec.Conns))
		for id, c := range rec.Conns {
			m[id] = c.Rev
		}
		records = append(records, seen{userID, m})
		return nil
	})
	if err != nil {
		return 0, err
	}
	live := make(map[string]struct{})
	err = s.store.ScanConns(ctx, func(userID, connID string, rec presence.ConnRecord, _ uint64) error {
		key := presence.ConnKey(userID, connID)
		live[key] = struct{}{}
		s.schedule(key, &rec)
		return nil
	})
	if err != nil {
		return 0, err
	}
	removed, removedConns := 0, 0
	for _, r := range records {
		var gone map[string]uint64
		for id, rev := range r.conns {
			if _, ok := live[presence.ConnKey(r.userID, id)]; !ok {
				if gone == nil {
					gone = make(map[string]uint64)
				}
				gone[id] = rev
			}
		}
		if gone == nil {
			continue
		}
		var before presence.Status
		n := 0
		rec, _, written, err := s.store.UpdateStatus(ctx, r.userID, func(rec *presence.Record) error {
			before, n = rec.Status, 0
			for id, rev := range gone {
				c, ok := rec.Conns[id]
				if !ok || c.Rev != rev {
					continue
				}
				// The listing may miss a key written while it ran: read the
				// key itself, after the record, before taking it as gone.
				_, _, err := s.store.Conn(ctx, r.userID, id)
				switch {
				case err == nil:
					continue
				case !errors.Is(err, presence.ErrNotFound):
					return err
				}
				delete(rec.Conns, id)
				n++
			}
			if n == 0 {
				return presence.ErrNoChange
			}
			return nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return removedConns, ctx.Err()
			}
			s.log.Error("sweep", "user_id", r.userID, "err", err)
			continue
		}
		if written {
			removed++
			removedConns += n
			s.metrics.removed.WithLabelValues("sweep").Add(float64(n))
			s.metrics.transition(before, rec.Status)
		}
	}
	if removed > 0 {
		s.log.Info("sweep removed ended connections", "users", removed, "conns", removedConns)
	}
	return removedConns, nil
}
