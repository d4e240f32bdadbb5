package reaper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/greendot/greendot/internal/sleep"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
)

// Service is a reaper instance.
type Service struct {
	cfg      Config
	log      *slog.Logger
	nc       *nats.Conn
	consumer *durable.Consumer
	// events publishes the events of the reaper's writes, and reports
	// them to the fanouts.
	events *presence.Publisher
	// store is set once Run has opened the buckets.
	store *presence.Store

	workers []chan task
	seed    maphash.Seed

	reg     *prometheus.Registry
	metrics *reaperMetrics
	// queue counts the tasks dispatched and not yet taken by a worker.
	queue atomic.Int64
	// sweepMu keeps sweeps (periodic and on request) one at a time.
	sweepMu sync.Mutex
	// swept counts the records (leases, status records, connection and
	// room keys) the sweep under way, or the last one, has read.
	swept atomic.Int64
	// startup is how the start-up sweep goes, for Ready.
	startup startupState
	rejoin  rejoin
}

// startupState is how the start-up sweep goes: the error of its last
// attempt, if one failed, and whether it waits to try again.
type startupState struct {
	failed  atomic.Pointer[error]
	waiting atomic.Bool
}

// rejoin tells when the reaper's NATS connection last came back.
type rejoin struct {
	mu         sync.Mutex
	reconnects uint64
	at         time.Time // zero before the first reconnect
}

// task is a piece of work for one user, run by the worker that owns the
// user, in order.
type task struct {
	userID string
	// The end of a lease: the user's connections held under it.
	lease *leaseEnd
	conns []string
	// The removal marker of a key of the earlier shape, at revision
	// removedAt; msg is acknowledged when the task is done.
	connID    string
	removedAt uint64
	msg       jetstream.Msg
	markedAt  time.Time
}

// leaseEnd is one lease's end being applied, user by user.
type leaseEnd struct {
	gateway, epoch string
	wg             sync.WaitGroup
	mu             sync.Mutex
	err            error
}

func (l *leaseEnd) done(err error) {
	if err != nil {
		l.mu.Lock()
		l.err = errors.Join(l.err, err)
		l.mu.Unlock()
	}
	l.wg.Done()
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
		nc:      nc,
		events:  presence.NewPublisher(nc),
		workers: make([]chan task, cfg.Workers),
		seed:    maphash.MakeSeed(),
		reg:     metrics.NewRegistry(),
	}
	for i := range s.workers {
		s.workers[i] = make(chan task, 256)
	}
	s.rejoin.reconnects = nc.Stats().Reconnects
	s.metrics = newReaperMetrics(s.reg, s)
	loops := []func(context.Context){s.watchReconnects}
	if cfg.SweepInterval > 0 {
		loops = append(loops, s.sweepLoop)
	}
	consumer, err := durable.New(nc, durable.Config{
		Name:    "reaper",
		Logger:  s.log,
		Buckets: cfg.Buckets,
		Bucket:  presence.LeasesBucket,
		Consumer: jetstream.ConsumerConfig{
			Durable:       presence.ReaperConsumer,
			Description:   "greendot reaper: the end of a gateway's lease ends its connections",
			FilterSubject: presence.KeySubject(presence.LeasesBucket, ">"),
			DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.AckWait,
			MaxAckPending: 1000,
		},
		Admin:     s.adminConfig(),
		NotReady:  ErrNotReady,
		Opened:    s.opened,
		Prepare:   s.startupSweep,
		Preparing: s.startupProgress,
		Work:      s.work,
		Handle:    s.handleLease,
		Loops:     loops,
		More: []durable.Stream{{
			// Keys of the earlier shape (two tokens), which end by
			// expiring: what is left of a deployment being upgraded.
			Bucket: presence.ConnsBucket,
			Consumer: jetstream.ConsumerConfig{
				Durable:       presence.ReaperConsumer,
				Description:   "greendot reaper: the end of a connection key of the earlier shape ends its connection",
				FilterSubject: presence.KeySubject(presence.ConnsBucket, presence.LegacyConnsFilter),
				DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       cfg.AckWait,
				MaxAckPending: 20_000,
			},
			PullMaxMessages: 2000,
			Handle:          s.handleLegacy,
		}, {
			// The ends of custom statuses' timers.
			Bucket: presence.TimersBucket,
			Consumer: jetstream.ConsumerConfig{
				Durable:       presence.ReaperConsumer,
				Description:   "greendot reaper: the end of a custom status's timer clears the custom status",
				FilterSubject: presence.KeySubject(presence.TimersBucket, presence.CustomTimerKey(">")),
				DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       cfg.AckWait,
				MaxAckPending: 1000,
			},
			Handle: s.handleCustomTimer,
		}},
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
	// Once nothing more is written, what was published is reported.
	defer s.events.Close()
	return s.consumer.Run(ctx)
}

// opened keeps the store Run opened.
func (s *Service) opened(store *presence.Store) {
	s.store = store
	store.OnConflict(s.metrics.conflicts.Inc)
	store.OnFeedLate(s.metrics.feedLate.Inc)
}

var (
	leaseSubjectPrefix  = presence.KeySubject(presence.LeasesBucket, "")
	connSubjectPrefix   = presence.KeySubject(presence.ConnsBucket, "")
	customSubjectPrefix = presence.KeySubject(presence.TimersBucket, presence.CustomTimerKey(""))
)

// handleLease takes one message of the lease stream: a refresh, which
// needs nothing, or the marker of a lease that ended (it expired, or was
// deleted), which ends every connection held under it. It runs on the
// consumer's goroutine and returns when the lease's end is applied.
func (s *Service) handleLease(msg jetstream.Msg) {
	gw, epoch, ok := presence.ParseLeaseKey(strings.TrimPrefix(msg.Subject(), leaseSubjectPrefix))
	if !ok || presence.EntryOp(msg.Headers()) == jetstream.KeyValuePut {
		_ = msg.Ack()
		return
	}
	if wait := s.rejoinWait(); wait > 0 {
		// NATS was away from this reaper, so perhaps from the lease's
		// gateway too: it is registering its connections again under a
		// new lease, and this end then finds none of them.
		s.log.Info("lease ended while NATS was away: applying its end later", "lease", presence.LeaseKey(gw, epoch), "in", wait.Round(time.Millisecond).String())
		_ = msg.NakWithDelay(wait)
		return
	}
	s.metrics.markers.WithLabelValues("lease_" + markerReason(msg.Headers())).Inc()
	start := time.Now()
	n, err := s.endLease(msg, gw, epoch)
	if err != nil {
		s.log.Error("end lease", "lease", presence.LeaseKey(gw, epoch), "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	s.metrics.leaseEnds.Inc()
	s.metrics.leaseEnd.Observe(time.Since(start).Seconds())
	if meta, err := msg.Metadata(); err == nil {
		s.metrics.markerLag.Observe(time.Since(meta.Timestamp).Seconds())
	}
	s.log.Info("lease ended", "lease", presence.LeaseKey(gw, epoch), "conns", n, "took", time.Since(start).Round(time.Millisecond).String())
	_ = msg.Ack()
}

// handleCustomTimer takes one message of the timers stream: a timer
// written, which needs nothing, or the end of one, which clears its
// user's custom status if it expired (a custom status set since, with
// another expiry or none, stays). It runs on the consumer's goroutine.
func (s *Service) handleCustomTimer(msg jetstream.Msg) {
	userID := strings.TrimPrefix(msg.Subject(), customSubjectPrefix)
	if presence.EntryOp(msg.Headers()) == jetstream.KeyValuePut || !presence.ValidUserID(userID) {
		_ = msg.Ack()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.AckWait)
	defer cancel()
	if err := s.clearCustom(ctx, userID); err != nil {
		s.metrics.customs.WithLabelValues(resultError).Inc()
		s.log.Error("clear expired custom status", "user_id", userID, "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.Ack()
}

// clearCustom clears userID's custom status if it expired, and publishes
// the events of the write. The end of a timer comes at its expiry or
// after, by the server's clock; one that comes before it by this
// process's clock is taken as at the expiry, so that a clock behind the
// server's does not leave it.
func (s *Service) clearCustom(ctx context.Context, userID string) error {
	w, err := s.store.ClearExpiredCustom(ctx, userID, time.Now().Add(customClockSlack))
	if err != nil {
		if undecodable(err) {
			s.log.Warn("ignoring undecodable status record", "user_id", userID, "kind", "custom", "err", err)
			return nil
		}
		return err
	}
	if !w.Written {
		s.metrics.customs.WithLabelValues(resultUnchanged).Inc()
		return nil
	}
	s.metrics.customs.WithLabelValues("cleared").Inc()
	if _, err := s.events.Publish(userID, &w, false); err != nil {
		s.log.Warn("publish events", "user_id", userID, "err", err)
	}
	return nil
}

// customClockSlack is how far ahead of this process's clock the end of a
// custom status's timer may be.
const customClockSlack = time.Second

// watchReconnects notes each time the NATS connection comes back, as
// soon as nats.go says so.
func (s *Service) watchReconnects(ctx context.Context) {
	natsconn.OnReconnect(ctx, s.nc, func() { s.rejoinWait() })
}

// rejoinWait returns how long the end of a lease must still wait, as
// Config.RejoinHold says, after the NATS connection came back. It reads
// the connection's reconnect count, which is current before any message
// arrives on the new connection, so a lease end delivered right after a
// reconnect waits even if the notice of it has not been read yet.
func (s *Service) rejoinWait() time.Duration {
	n := s.nc.Stats().Reconnects
	s.rejoin.mu.Lock()
	defer s.rejoin.mu.Unlock()
	if n != s.rejoin.reconnects {
		s.rejoin.reconnects, s.rejoin.at = n, time.Now()
	}
	if s.rejoin.at.IsZero() || s.cfg.RejoinHold <= 0 {
		return 0
	}
	return time.Until(s.rejoin.at.Add(s.cfg.RejoinHold))
}

// endLease takes every connection held under a lease out of its user's
// record, the users' workers in parallel, and then removes their keys. It
// tells the server the message is in progress while it works.
func (s *Service) endLease(msg jetstream.Msg, gw, epoch string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*s.cfg.AckWait)
	defer cancel()
	conns, err := s.store.LeaseConns(ctx, gw, epoch)
	if err != nil {
		return 0, err
	}
	byUser := make(map[string][]string)
	for _, c := range conns {
		byUser[c.UserID] = append(byUser[c.UserID], c.ConnID)
	}
	le := &leaseEnd{gateway: gw, epoch: epoch}
	progress := time.NewTicker(max(s.cfg.AckWait/3, 100*time.Millisecond))
	defer progress.Stop()
	for user, ids := range byUser {
		le.wg.Add(1)
		for !s.tryDispatch(task{userID: user, lease: le, conns: ids}) {
			select {
			case <-progress.C:
				_ = msg.InProgress()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	done := make(chan struct{})
	go func() {
		le.wg.Wait()
		close(done)
	}()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-progress.C:
			_ = msg.InProgress()
		}
	}
	if le.err != nil {
		return 0, le.err
	}
	if err := s.store.RemoveLeaseConns(ctx, gw, epoch); err != nil {
		return 0, err
	}
	rooms, err := s.store.LeaseRoomKeys(ctx, gw, epoch)
	if err != nil {
		return 0, err
	}
	if err := s.endLeaseRooms(ctx, gw, epoch, rooms); err != nil {
		return 0, err
	}
	return len(conns), nil
}

// endLeaseRooms ends the room memberships held under a lease that ended:
// it publishes a leave on each key's room subject (with the key's
// revision, so that a key written again under a new lease is not taken
// for it), removes the keys in one request, and then tells every gateway
// the lease's memberships are over (presence.room.lease_ended), for the
// events a gateway may have missed.
func (s *Service) endLeaseRooms(ctx context.Context, gw, epoch string, keys []presence.RoomEntry) error {
	for _, e := range keys {
		ev := presence.RoomEvent{Room: e.Member.Room, Op: presence.RoomLeave, UserID: e.Member.UserID,
			ConnID: e.Member.ConnID, Gateway: gw, Epoch: epoch, Rev: e.Rev}
		data, err := json.Marshal(&ev)
		if err != nil {
			return err
		}
		if err := s.nc.Publish(presence.RoomSubject(e.Member.Room), data); err != nil {
			return fmt.Errorf("publish room leave: %w", err)
		}
	}
	if err := s.store.PurgeLeaseRooms(ctx, gw, epoch); err != nil {
		return err
	}
	data, err := json.Marshal(&presence.RoomLeaseEnded{Gateway: gw, Epoch: epoch})
	if err != nil {
		return err
	}
	if err := s.nc.Publish(presence.RoomLeaseEndedSubject, data); err != nil {
		return fmt.Errorf("publish lease end to rooms: %w", err)
	}
	s.metrics.roomLeaves.Add(float64(len(keys)))
	return nil
}

// handleLegacy takes one message of the connection stream about a key of
// the earlier shape: its removal (expiry, purge, or the end of the
// offline grace) ends its connection.
func (s *Service) handleLegacy(msg jetstream.Msg) {
	userID, connID, ok := presence.SplitConnKey(strings.TrimPrefix(msg.Subject(), connSubjectPrefix))
	if !ok || presence.EntryOp(msg.Headers()) == jetstream.KeyValuePut {
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
	s.dispatch(task{userID: userID, connID: connID, removedAt: meta.Sequence.Stream, msg: msg, markedAt: meta.Timestamp})
}

func (s *Service) worker(userID string) chan task {
	var h maphash.Hash
	h.SetSeed(s.seed)
	_, _ = h.WriteString(userID)
	return s.workers[h.Sum64()%uint64(len(s.workers))]
}

func (s *Service) dispatch(t task) {
	s.queue.Add(1)
	s.worker(t.userID) <- t
}

// tryDispatch dispatches t unless its worker's queue is full.
func (s *Service) tryDispatch(t task) bool {
	select {
	case s.worker(t.userID) <- t:
		s.queue.Add(1)
		return true
	default:
		return false
	}
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
	if t.lease != nil {
		t.lease.done(s.removeLeased(ctx, t.userID, t.lease.gateway, t.lease.epoch, t.conns))
		return
	}
	err := s.removeLegacy(ctx, t.userID, t.connID, t.removedAt)
	switch {
	case err != nil:
		s.log.Error("reconcile", "user_id", t.userID, "conn_id", t.connID, "err", err)
		_ = t.msg.NakWithDelay(time.Second)
	default:
		s.metrics.markerLag.Observe(time.Since(t.markedAt).Seconds())
		_ = t.msg.Ack()
	}
}

// removeLeased takes a user's connections held under a lease out of the
// user's record: those the record still has under that lease, and no
// other (a connection its gateway registered again under a new lease
// stays).
func (s *Service) removeLeased(ctx context.Context, userID, gw, epoch string, conns []string) error {
	return s.write(ctx, userID, kindLease, func(r *presence.Record) (int, error) {
		n := 0
		for _, id := range conns {
			if c, ok := r.Conns[id]; ok && c.Gateway == gw && c.Lease == epoch {
				r.RemoveConn(id, 0)
				n++
			}
		}
		return n, nil
	})
}

// removeLegacy applies the end of a key of the earlier shape, seen as a
// removal marker at revision markerRev: it leaves the user's record if the
// record's connection was created after the marker (its gateway made it
// again).
func (s *Service) removeLegacy(ctx context.Context, userID, connID string, markerRev uint64) error {
	return s.write(ctx, userID, kindRemoval, func(r *presence.Record) (int, error) {
		c, ok := r.Conns[connID]
		if !ok || c.Lease != "" || c.Rev >= markerRev {
			return 0, nil
		}
		r.RemoveConn(connID, 0)
		return 1, nil
	})
}

// write changes a user's record by compare-and-set from a fresh read each
// attempt (remove says how many connections it took out; none means
// nothing to write), and publishes the events the write calls for.
//
// A record that cannot be decoded (not greendot's: one put by hand) is
// left as it is, logged and counted: it holds no connection to take out,
// and reading it again will not change that, so the rest of the work (the
// other users of a lease, and its keys) goes on.
func (s *Service) write(ctx context.Context, userID, kind string, remove func(*presence.Record) (int, error)) error {
	start := time.Now()
	n := 0
	var removeErr error
	w, err := s.store.WriteStatus(ctx, userID, &presence.Cached{}, func(r *presence.Record) error {
		if n, removeErr = remove(r); removeErr != nil {
			return removeErr
		}
		if n == 0 {
			return presence.ErrNoChange
		}
		return nil
	})
	// An error of remove's own (a connection key a sweep could not
	// decode) is not the record's.
	if err != nil && removeErr == nil && undecodable(err) {
		s.metrics.ignored(kind, start)
		s.log.Warn("ignoring undecodable status record", "user_id", userID, "kind", kind, "err", err)
		return nil
	}
	s.metrics.done(kind, start, w.Written, err, w.Prev.Status, w.Next.Status)
	if err != nil {
		return err
	}
	if !w.Written {
		return nil
	}
	s.metrics.removed.WithLabelValues(kind).Add(float64(n))
	if _, err := s.events.Publish(userID, &w, false); err != nil {
		s.log.Warn("publish events", "user_id", userID, "err", err)
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.LogAttrs(ctx, slog.LevelDebug, "connections ended", slog.String("user_id", userID),
			slog.Int("conns", n), slog.String("status", string(w.Next.Status)))
	}
	return nil
}

// undecodable reports whether err says a stored record is not JSON of a
// record's shape.
func undecodable(err error) bool {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return errors.As(err, &syntax) || errors.As(err, &typ)
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
		s.startup.failed.Store(&err)
		s.startup.waiting.Store(true)
		slept := sleep.For(ctx, wait)
		s.startup.waiting.Store(false)
		if slept != nil {
			return slept
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// startupProgress says how the start-up sweep goes, for Ready while it
// runs: how many records it has read, and the error of its last attempt
// if one failed.
func (s *Service) startupProgress() string {
	read := s.swept.Load()
	p := s.startup.failed.Load()
	switch {
	case p == nil:
		return fmt.Sprintf("start-up sweep under way (%d records read)", read)
	case s.startup.waiting.Load():
		return fmt.Sprintf("start-up sweep failed after %d records read, retrying: %v", read, *p)
	default:
		return fmt.Sprintf("start-up sweep under way again (%d records read); the last attempt failed: %v", read, *p)
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

// sweep repairs what no lease end or marker this reaper saw did: it takes
// out of every record the connections held under a lease that is over,
// and those whose key of the earlier shape is gone, and removes the keys
// of connections held under a lease that is over.
//
// It reads the live leases and every status record, then (for keys of the
// earlier shape) lists the live keys. Listings are not snapshots, so a
// connection they leave out is only a candidate: its lease, or its key, is
// read from the stream leader after its record, and only one that is gone
// ends the connection. A lease never comes back once over (each has an
// epoch of its own), and a connection its gateway registered again under a
// new lease has a record entry naming the new one.
func (s *Service) sweep(ctx context.Context) (int, error) {
	s.swept.Store(0)
	leases, err := s.store.Leases(ctx)
	if err != nil {
		return 0, err
	}
	s.swept.Add(int64(len(leases)))
	over := newLeaseCheck(s.store, leases, s.rejoinWait)
	type seen struct {
		userID string
		conns  map[string]presence.ConnInfo
	}
	var records []seen
	var expired []string // users whose custom status expired
	legacy := false
	now := time.Now()
	err = s.store.ScanStatusAll(ctx, func(userID string, rec presence.Record, _ uint64) error {
		s.swept.Add(1)
		if rec.Custom.Expired(now) {
			expired = append(expired, userID)
		}
		if len(rec.Conns) == 0 {
			return nil
		}
		records = append(records, seen{userID, rec.Conns})
		for _, c := range rec.Conns {
			legacy = legacy || c.Lease == ""
		}
		return nil
	}, func(string, error) { s.swept.Add(1) }) // read, and not greendot's: nothing to sweep
	if err != nil {
		return 0, err
	}
	live := make(map[string]struct{})
	if legacy {
		err = s.store.ScanConns(ctx, func(userID, connID string, _ presence.ConnRecord, _ uint64) error {
			s.swept.Add(1)
			live[presence.ConnKey(userID, connID)] = struct{}{}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	// Custom statuses whose timer's end nobody applied (a reaper down for
	// longer than the timers' markers stay).
	for _, u := range expired {
		if err := s.clearCustom(ctx, u); err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			s.log.Error("sweep", "user_id", u, "err", err)
		}
	}
	removed, removedConns := 0, 0
	for _, r := range records {
		gone := make(map[string]presence.ConnInfo)
		for id, c := range r.conns {
			if c.Lease != "" {
				if o, err := over.check(ctx, c.Gateway, c.Lease); err != nil {
					return removedConns, err
				} else if o {
					gone[id] = c
				}
				continue
			}
			if _, ok := live[presence.ConnKey(r.userID, id)]; !ok {
				gone[id] = c
			}
		}
		if len(gone) == 0 {
			continue
		}
		n := 0
		err := s.write(ctx, r.userID, kindSweep, func(rec *presence.Record) (int, error) {
			n = 0
			for id, was := range gone {
				c, ok := rec.Conns[id]
				if !ok || c != was {
					continue // written again since it was seen
				}
				if c.Lease == "" {
					// The listing may miss a key written while it ran: read
					// the key itself, after the record.
					_, _, err := s.store.Conn(ctx, r.userID, id)
					switch {
					case err == nil:
						continue
					case !errors.Is(err, presence.ErrNotFound):
						return 0, err
					}
				}
				rec.RemoveConn(id, 0)
				n++
			}
			return n, nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return removedConns, ctx.Err()
			}
			s.log.Error("sweep", "user_id", r.userID, "err", err)
			continue
		}
		if n > 0 {
			removed++
			removedConns += n
		}
	}
	// The keys of leases that are over, left behind by a lease end that
	// failed half-way, or that nobody saw.
	orphans := make(map[[2]string]bool)
	err = s.store.ScanLeaseConns(ctx, func(c presence.LeaseConn) error {
		s.swept.Add(1)
		if _, ok := leases[presence.LeaseKey(c.Gateway, c.Epoch)]; !ok {
			orphans[[2]string{c.Gateway, c.Epoch}] = true
		}
		return nil
	})
	if err != nil {
		return removedConns, err
	}
	for l := range orphans {
		if o, err := over.check(ctx, l[0], l[1]); err != nil || !o {
			continue
		}
		if err := s.store.RemoveLeaseConns(ctx, l[0], l[1]); err != nil {
			s.log.Error("sweep", "lease", presence.LeaseKey(l[0], l[1]), "err", err)
		}
	}
	if err := s.sweepRooms(ctx, leases, over); err != nil {
		return removedConns, err
	}
	if removed > 0 {
		s.log.Info("sweep removed ended connections", "users", removed, "conns", removedConns)
	}
	if over.held {
		s.log.Info("sweep left the ends of leases to the rejoin hold", "in", s.rejoinWait().Round(time.Millisecond).String())
	}
	return removedConns, nil
}

// sweepRooms ends the room memberships held under leases that are over:
// left behind by a lease end that failed half-way, or that nobody saw.
func (s *Service) sweepRooms(ctx context.Context, live map[string]presence.LeaseRecord, over *leaseCheck) error {
	keys, err := s.store.ScanRoomKeys(ctx)
	if err != nil {
		return err
	}
	s.swept.Add(int64(len(keys)))
	orphans := make(map[[2]string][]presence.RoomEntry)
	for _, e := range keys {
		if _, ok := live[presence.LeaseKey(e.Member.Gateway, e.Member.Epoch)]; !ok {
			l := [2]string{e.Member.Gateway, e.Member.Epoch}
			orphans[l] = append(orphans[l], e)
		}
	}
	for l, entries := range orphans {
		if o, err := over.check(ctx, l[0], l[1]); err != nil || !o {
			continue
		}
		if err := s.endLeaseRooms(ctx, l[0], l[1], entries); err != nil {
			s.log.Error("sweep rooms", "lease", presence.LeaseKey(l[0], l[1]), "err", err)
		}
	}
	return nil
}

// leaseCheck tells, during one sweep, whether a lease is over: not among
// the live ones listed, and confirmed gone by a read from the stream
// leader (the listing may miss a lease taken while it ran). While the
// ends of leases are held back after a reconnect (Config.RejoinHold), no
// lease is over to a sweep.
type leaseCheck struct {
	store *presence.Store
	live  map[string]presence.LeaseRecord
	over  map[string]bool
	// hold returns how long the ends of leases must still wait
	// (Service.rejoinWait); held says a lease was left to it.
	hold func() time.Duration
	held bool
}

func newLeaseCheck(store *presence.Store, live map[string]presence.LeaseRecord, hold func() time.Duration) *leaseCheck {
	return &leaseCheck{store: store, live: live, over: make(map[string]bool), hold: hold}
}

func (l *leaseCheck) check(ctx context.Context, gw, epoch string) (bool, error) {
	key := presence.LeaseKey(gw, epoch)
	if _, ok := l.live[key]; ok {
		return false, nil
	}
	if l.hold() > 0 {
		// As in handleLease: NATS was away from this reaper, so perhaps
		// from the lease's gateway too, which is registering its
		// connections again under a new lease. Asked at each use, not
		// once per sweep: NATS may come back while the sweep runs.
		l.held = true
		return false, nil
	}
	if o, ok := l.over[key]; ok {
		return o, nil
	}
	_, _, err := l.store.Lease(ctx, gw, epoch)
	switch {
	case err == nil:
		l.over[key] = false
	case errors.Is(err, presence.ErrNotFound):
		l.over[key] = true
	default:
		return false, fmt.Errorf("read lease %s: %w", key, err)
	}
	return l.over[key], nil
}
