package fanout

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// Service is a fanout instance.
type Service struct {
	nc       *nats.Conn
	cfg      Config
	log      *slog.Logger
	consumer *durable.Consumer

	// sent holds, per user, the versions of the newest revision this
	// instance handled. It is touched only by the consume callback, which
	// runs on one goroutine.
	sent map[string]versions
	// cached is len(sent), for the metrics.
	cached atomic.Int64
	// out holds, per user, the newest revisions whose events are known to
	// have reached the server: work notes them, and a revision delivered
	// again has its events published again unless they cover it (again).
	out *outRevs

	// seen holds the events writers published, as their reports
	// (presence.Published) said; work reads the reports from reports,
	// which queues them, before it looks at the revisions due. reports
	// is nil if the subscription failed.
	seen    *seenEvents
	reports *nats.Subscription
	// due holds the revisions whose events wait for Delay to pass, in the
	// order they were consumed: handle appends, work takes them. The
	// consumer's MaxAckPending bounds it. wake tells work that due is no
	// longer empty.
	dueMu sync.Mutex
	due   []*pending
	wake  chan struct{}

	// retry holds, in the order they failed, the revisions whose events
	// work could not publish (its connection down and its reconnect
	// buffer full), to try again at retryAt; only work touches them.
	// held is, per user, the newest of them: process leaves a redelivery
	// of it alone, for its try acknowledges it, where it would otherwise
	// acknowledge it as handled already.
	retry   []*pending
	retryAt time.Time
	heldMu  sync.Mutex
	held    map[string]uint64

	reg     *prometheus.Registry
	metrics *fanoutMetrics
}

// versions are what this instance last handled of a user: the record's
// public and self versions, and the revision they came from.
type versions struct{ pub, self, rev uint64 }

// pending is a revision whose events the fanout publishes unless it sees
// its writer publish them first.
type pending struct {
	msg    jetstream.Msg
	userID string
	rev    uint64
	// pub and self say which events the revision calls for: its public
	// event, and its self events (to the gateways holding a live
	// connection of the user, which its record names). The events are
	// made from the record (events) only when one is to be published:
	// its writer's report covers most.
	pub, self bool
	due       time.Time
	// wrote says that finish published an event of it, which only a
	// flush of the connection confirms.
	wrote bool
}

// New validates cfg and returns a fanout that will use nc. It starts no
// goroutines and does no I/O. The caller owns nc.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{
		nc:   nc,
		cfg:  cfg,
		log:  cfg.Logger.With("svc", "fanout"),
		sent: make(map[string]versions),
		seen: newSeenEvents(),
		out:  newOutRevs(cfg.CacheSize),
		wake: make(chan struct{}, 1),
		held: make(map[string]uint64),
		reg:  metrics.NewRegistry(),
	}
	s.metrics = newFanoutMetrics(s.reg, s)
	consumer, err := durable.New(nc, durable.Config{
		Name:    "fanout",
		Logger:  s.log,
		Buckets: cfg.Buckets,
		Bucket:  presence.StatusBucket,
		Consumer: jetstream.ConsumerConfig{
			Durable:       presence.FanoutConsumer,
			Description:   "greendot fanout: makes sure every status revision's events are published",
			FilterSubject: presence.KeySubject(presence.StatusBucket, ">"),
			DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.AckWait,
			MaxAckPending: maxAckPending,
		},
		PullMaxMessages: 1000,
		// A revision's events are due Delay after its write: the fanout
		// can wait for a batch, which NATS sends it in a few writes.
		PullEvery: tickOf(cfg.Delay),
		Admin:     s.adminConfig(),
		NotReady:  ErrNotReady,
		Opened:    s.opened,
		Work:      s.work,
		Handle:    s.handle,
	})
	if err != nil {
		return nil, err
	}
	s.consumer = consumer
	return s, nil
}

// maxAckPending bounds the revisions handed out and not yet acknowledged:
// those waiting for Delay to pass among them.
const maxAckPending = 10_000

// Run consumes status revisions until ctx is canceled, then stops
// consuming, finishes the revisions handed out, and returns nil. It
// returns an error only when the fanout cannot start.
func (s *Service) Run(ctx context.Context) error {
	return s.consumer.Run(ctx)
}

// opened subscribes to the writers' reports of the events they published,
// before the first revision is consumed. The subscription queues them for
// work, which reads them once per tick: no goroutine wakes for each.
func (s *Service) opened(*presence.Store) {
	sub, err := s.nc.SubscribeSync(presence.PublishedSubject)
	if err != nil {
		// Without it every revision's events are published again:
		// duplicates, which gateways drop.
		s.log.Error("subscribe to the writers' reports", "subject", presence.PublishedSubject, "err", err)
		return
	}
	_ = sub.SetPendingLimits(-1, 64<<20)
	s.reports = sub
}

// readSeen notes the reports queued on the subscription.
func (s *Service) readSeen() {
	if s.reports == nil {
		return
	}
	n, _, err := s.reports.Pending()
	for ; err == nil && n > 0; n-- {
		m, err := s.reports.NextMsg(0)
		if err != nil {
			break
		}
		s.saw(m)
	}
}

// saw notes the events a writer reports it published.
func (s *Service) saw(m *nats.Msg) {
	var rep presence.Published
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		s.log.Warn("ignoring an undecodable report of published events", "err", err)
		return
	}
	s.seen.noteAll(&rep)
}

var statusSubjectPrefix = presence.KeySubject(presence.StatusBucket, "")

// handle works out what one status revision calls for. Nothing: it is
// acknowledged. Events: they are handed to work, which publishes those its
// writer did not publish within Delay, and then acknowledges it.
func (s *Service) handle(msg jetstream.Msg) {
	s.metrics.revisions.Inc()
	p, err := s.process(msg)
	if errors.Is(err, errHeld) {
		return // its try acknowledges it
	}
	if err != nil {
		s.metrics.failed.Inc()
		s.log.Error("fanout revision", "subject", msg.Subject(), "err", err)
		// Ask for redelivery later; a malformed record is acknowledged by
		// process instead, since retrying it cannot help.
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if p == nil {
		_ = msg.Ack()
		return
	}
	s.dueMu.Lock()
	first := len(s.due) == 0
	s.due = append(s.due, p)
	s.dueMu.Unlock()
	if first {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// process reads a revision's versions and returns which events it calls
// for, or nil when it calls for none.
func (s *Service) process(msg jetstream.Msg) (*pending, error) {
	userID := strings.TrimPrefix(msg.Subject(), statusSubjectPrefix)
	if !presence.ValidUserID(userID) {
		s.metrics.ignored.WithLabelValues("invalid_key").Inc()
		s.log.Warn("ignoring status key that is not a user id", "subject", msg.Subject())
		return nil, nil
	}
	meta, err := msg.Metadata()
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	rev := meta.Sequence.Stream

	// The versions alone decide which events the revision calls for;
	// the record is decoded whole only if one is to be published.
	var rec presence.Versions
	next := &rec
	if presence.EntryOp(msg.Headers()) != jetstream.KeyValuePut {
		next = nil // deleted (an operator's `nats kv del`): offline to everyone
	} else if err := json.Unmarshal(msg.Data(), &rec); err != nil {
		s.metrics.ignored.WithLabelValues("undecodable").Inc()
		s.log.Warn("ignoring undecodable status record", "user_id", userID, "err", err)
		return nil, nil
	}

	due := dueAt(meta.Timestamp, time.Now(), s.cfg.Delay)
	last, known := s.sent[userID]
	if known && rev <= last.rev {
		return s.again(msg, userID, rev, next, due)
	}
	// What this instance handled last stands for the record before: the
	// versions move with every change, so a fanout that skipped revisions
	// (History keeps a few) or restarted still knows what moved. A record
	// made again after a deletion starts them over, which differs too.
	var prev *presence.Versions
	if known {
		prev = &presence.Versions{PubVer: last.pub, SelfVer: last.self}
	}
	pub, self := presence.Moved(prev, next)
	if unmovedPublic(next) {
		// The revision that moved the public view last has its event,
		// from its writer or the instance that handled it, whatever
		// this one knows of the user: its versions are those of the
		// revisions it handled, not of the last one published.
		pub = false
	}

	if len(s.sent) >= s.cfg.CacheSize {
		clear(s.sent)
	}
	s.sent[userID] = versions{pub: rec.PubVer, self: rec.SelfVer, rev: rev}
	s.cached.Store(int64(len(s.sent)))
	if !pub {
		s.metrics.suppressed.Inc()
	}
	if !pub && !self {
		return nil, nil
	}
	return &pending{msg: msg, userID: userID, rev: rev, pub: pub, self: self, due: due}, nil
}

// dueAt returns when the events of a revision the server stored at written
// (its clock) and this instance received at received (its own) are due:
// Delay after the earlier of the two, on this instance's clock. A server
// clock ahead of this one would otherwise hold revisions back by the skew
// (and their redeliveries could come while they wait), so a revision never
// waits longer than Delay after it arrived; a revision that arrived late
// (a backlog) is due Delay after its write. A server clock behind this one
// still makes revisions due early by the skew: their events may go out
// before their writers' reports come, duplicates that gateways drop.
func dueAt(written, received time.Time, delay time.Duration) time.Time {
	if written.After(received) {
		written = received
	}
	return written.Add(delay)
}

// again works out what a revision no newer than the one handled last
// calls for: it was delivered again because its acknowledgement was lost,
// perhaps with its events, both in flight on a connection that died. The
// events known to be out, its own or a newer revision's (gateways would
// drop them), are not published again, nor is a revision's held for
// another try; the rest are, as if the record before were unknown. What
// it says is out of date: sent stays where it is.
func (s *Service) again(msg jetstream.Msg, userID string, rev uint64, next *presence.Versions, due time.Time) (*pending, error) {
	if s.isHeld(userID, rev) {
		return nil, errHeld
	}
	out := s.out.of(userID)
	pub, self := presence.Moved(nil, next)
	pub = pub && rev > out.pub && !unmovedPublic(next)
	self = self && rev > out.self
	if !pub && !self {
		s.metrics.ignored.WithLabelValues("stale").Inc()
		return nil, nil
	}
	return &pending{msg: msg, userID: userID, rev: rev, pub: pub, self: self, due: due}, nil
}

// unmovedPublic reports whether next, a revision's record (nil when
// deleted), says it left the public view as the revision before it had
// it: it calls for no public event, whatever this instance handled. (A
// revision that moved the view, whose writer died before publishing, and
// that the bucket's history dropped before any fanout handled it, behind
// StatusHistory later ones that did not move it, would go unpublished.)
func unmovedPublic(next *presence.Versions) bool {
	return next != nil && next.PubSince != 0
}

// errHeld says that a revision delivered again is one whose events wait
// for another try.
var errHeld = errors.New("held for another try")

// isHeld reports whether rev is the newest revision of user whose events
// wait for another try.
func (s *Service) isHeld(user string, rev uint64) bool {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	held, ok := s.held[user]
	return ok && held == rev
}

// work publishes, once Delay has passed since each revision was written,
// the events its writer did not publish, and acknowledges the revision,
// until ctx is canceled; then it finishes at once the revisions it holds,
// and ends the subscriptions. Events it could not publish it tries again
// every retryEvery, and acknowledges their revision once they are out.
// While revisions wait it looks every tick (a fifth of Delay, at most
// 50ms): a revision's events wait at most that long past Delay, and no
// goroutine wakes per revision or per event seen; while none wait it does
// not tick at all.
func (s *Service) work(ctx context.Context) {
	defer func() {
		if s.reports != nil {
			_ = s.reports.Unsubscribe()
		}
	}()
	prune := time.NewTicker(seenFor)
	defer prune.Stop()
	step := tickOf(s.cfg.Delay)
	tick := time.NewTicker(step)
	tick.Stop()
	defer tick.Stop()
	ticking := false
	for {
		var tc <-chan time.Time
		if ticking {
			tc = tick.C
		}
		select {
		case <-ctx.Done():
			s.readSeen()
			s.finishDue(time.Time{})
			s.handBack()
			return
		case now := <-prune.C:
			s.seen.prune(now.Add(-seenFor))
		case <-s.wake:
			if !ticking {
				tick.Reset(step)
				ticking = true
			}
		case now := <-tc:
			s.readSeen()
			waiting := s.finishDue(now)
			if len(s.retry) > 0 && !now.Before(s.retryAt) {
				s.tryAgain(now)
			}
			if !waiting && len(s.retry) == 0 {
				// Nothing waits: the next revision's wake starts the
				// ticks again (one handled meanwhile sent it already).
				tick.Stop()
				ticking = false
			}
		}
	}
}

// tickOf returns how often the fanout looks at revisions waiting for
// delay to pass: a fifth of it, from 1ms to 50ms.
func tickOf(delay time.Duration) time.Duration {
	return min(max(delay/5, time.Millisecond), 50*time.Millisecond)
}

// finishDue finishes, in the order they were consumed, the revisions due
// at now (all of them for the zero time), up to the first that is not, and
// reports whether any still wait.
func (s *Service) finishDue(now time.Time) bool {
	s.dueMu.Lock()
	n := 0
	for n < len(s.due) && (now.IsZero() || !s.due[n].due.After(now)) {
		n++
	}
	batch := s.due[:n:n]
	s.due = s.due[n:]
	if len(s.due) == 0 {
		s.due = nil // let the backing array go
	}
	waiting := len(s.due) > 0
	s.dueMu.Unlock()
	failed, firstErr := s.finishAll(batch)
	clear(batch) // the array may live on under s.due
	if len(failed) > 0 {
		if len(s.retry) == 0 {
			s.retryAt = now.Add(retryEvery)
		}
		s.retry = append(s.retry, failed...)
		s.noteHeld()
		s.log.Error("publish events; trying again", "revisions", len(failed), "waiting", len(s.retry), "err", firstErr)
	}
	return waiting
}

// retryEvery is how often the fanout tries again to publish the events it
// could not.
const retryEvery = time.Second

// tryAgain publishes the events of the revisions held for another try,
// and acknowledges each revision whose events are out. The rest wait for
// the next try, at now plus retryEvery; each is told to the server as in
// progress, so that it is not delivered again meanwhile.
func (s *Service) tryAgain(now time.Time) {
	left, firstErr := s.finishAll(s.retry)
	for _, p := range left {
		_ = p.msg.InProgress()
	}
	if n := len(s.retry) - len(left); n > 0 {
		s.log.Info("published events on another try", "revisions", n)
	}
	if len(left) > 0 {
		s.log.Error("publish events; trying again", "waiting", len(left), "err", firstErr)
	}
	clear(s.retry)
	s.retry, s.retryAt = left, now.Add(retryEvery)
	s.noteHeld()
}

// finishAll finishes each of batch, and returns those whose events could
// not all be published, with the first error; it notes the others' events
// as out once the server confirmed it has them. One flush per batch, and
// none for a batch that published nothing (a healthy system's).
func (s *Service) finishAll(batch []*pending) (failed []*pending, firstErr error) {
	if len(batch) == 0 {
		return nil, nil
	}
	// Read before publishing: read after, it could count a reconnect that
	// completed meanwhile, and a flush of the new connection would vouch
	// for events lost with the old one.
	conn := s.nc.Stats().Reconnects
	wrote := false
	for _, p := range batch {
		if err := s.finish(p); err != nil {
			failed = append(failed, p)
			firstErr = cmp.Or(firstErr, err)
		}
		wrote = wrote || p.wrote
	}
	s.out.noteAll(batch, failed, wrote && s.flushed(conn))
	return failed, firstErr
}

// flushTimeout bounds the wait for the server to confirm that it has what
// a batch of finishes published: a healthy server answers within
// milliseconds; a stalled one holds the work up this long at most, and
// the batch's events count as lost.
const flushTimeout = time.Second

// flushed reports whether the server has everything published on the
// connection since its reconnect count was conn: it answered a ping on
// the same connection. Bytes written to a connection that died are lost
// without an error, acknowledgements with the events they follow, and the
// server then delivers those revisions again.
func (s *Service) flushed(conn uint64) bool {
	return s.nc.IsConnected() && s.nc.FlushTimeout(flushTimeout) == nil && s.nc.Stats().Reconnects == conn
}

// noteHeld makes held say, per user, the newest revision in retry.
func (s *Service) noteHeld() {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	clear(s.held)
	for _, p := range s.retry {
		s.held[p.userID] = max(s.held[p.userID], p.rev)
	}
}

// handBack asks for the redelivery of the revisions still held for
// another try as the fanout stops: to another instance, or to this one
// started again, neither of which has handled them.
func (s *Service) handBack() {
	for _, p := range s.retry {
		_ = p.msg.Nak()
	}
	s.retry = nil
}

// finish publishes what a revision calls for that its writer did not,
// then acknowledges it. The acknowledgement goes out on the same
// connection after the events, so if it reaches the server the events
// did too; if the connection dies with both in flight, both are lost, and
// the revision comes again (again). If an event cannot be published, it
// returns the error and leaves the revision unacknowledged: its events may
// be published again on another try, which gateways drop as not newer.
func (s *Service) finish(p *pending) error {
	pub := p.pub && !s.seen.has(p.userID, false, p.rev)
	if p.pub && !pub {
		s.metrics.covered.Inc()
	}
	self := p.self && !s.seen.has(p.userID, true, p.rev)
	if !pub && !self {
		_ = p.msg.Ack()
		return nil
	}
	ev, selfEv, gateways, err := p.events()
	if err != nil {
		// The versions were readable, the record is not: nothing of it
		// can be told.
		s.metrics.ignored.WithLabelValues("undecodable").Inc()
		s.log.Warn("ignoring undecodable status record", "user_id", p.userID, "err", err)
		_ = p.msg.Ack()
		return nil
	}
	if pub {
		if err := s.publish(presence.EventSubject(p.userID), ev); err != nil {
			s.metrics.failed.Inc()
			return err
		}
		p.wrote = true
		s.metrics.published.Inc()
		if ev.At != 0 {
			s.metrics.lag.Observe(time.Since(time.UnixMilli(ev.At)).Seconds())
		}
	}
	if self && selfEv != nil {
		for _, gw := range gateways {
			if err := s.publish(presence.SelfSubject(gw), selfEv); err != nil {
				s.metrics.failed.Inc()
				return err
			}
			p.wrote = true
			s.metrics.self.Inc()
		}
	}
	_ = p.msg.Ack()
	return nil
}

// events decodes the revision's record and returns its public event, its
// self event and the gateways that one goes to (none while the user has no
// live connection); a deleted record's are offline and none.
func (p *pending) events() (*presence.Event, *presence.SelfEvent, []string, error) {
	var next *presence.Record
	if presence.EntryOp(p.msg.Headers()) == jetstream.KeyValuePut {
		next = new(presence.Record)
		if err := json.Unmarshal(p.msg.Data(), next); err != nil {
			return nil, nil, nil, err
		}
	}
	ev, self, gateways := presence.Changes(p.userID, &presence.Record{}, next, p.rev)
	return ev, self, gateways, nil
}

func (s *Service) publish(subject string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := s.nc.Publish(subject, data); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return nil
}

// outRevs are, per user, the newest revisions whose public event, and
// whose self events, are known to have reached the server: published by
// this instance on a connection that confirmed them, or reported by their
// writers. It is safe for concurrent use.
type outRevs struct {
	mu   sync.Mutex
	most int
	m    map[string]outRev
}

type outRev struct{ pub, self uint64 }

func newOutRevs(most int) *outRevs {
	return &outRevs{most: most, m: make(map[string]outRev)}
}

// of returns the revisions of user's events known to be out.
func (o *outRevs) of(user string) outRev {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.m[user]
}

// noteAll notes as out the events of the finished revisions of batch, the
// ones not among failed (a subsequence of batch): those whose finish
// published nothing (their writers' reports covered them), and, if
// flushed, the rest. A revision not noted has its events published again
// if it is delivered again.
func (o *outRevs) noteAll(batch, failed []*pending, flushed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range batch {
		if len(failed) > 0 && failed[0] == p {
			failed = failed[1:]
			continue
		}
		if !p.wrote || flushed {
			o.note(p)
		}
	}
}

// note notes that the events p calls for are out. When the memory is
// full it starts over, as sent does: a revision delivered again then has
// its events published again, which gateways drop.
func (o *outRevs) note(p *pending) {
	r, ok := o.m[p.userID]
	if !ok && len(o.m) >= o.most {
		clear(o.m)
	}
	if p.pub {
		r.pub = max(r.pub, p.rev)
	}
	if p.self {
		r.self = max(r.self, p.rev)
	}
	o.m[p.userID] = r
}

// seenFor is how long the fanout remembers an event a writer published:
// far longer than Delay, and than a revision takes to reach the fanout.
const seenFor = time.Minute

// seenEvents are the newest revisions whose events writers published, per
// user: public events and self events apart. It is safe for concurrent
// use.
type seenEvents struct {
	mu   sync.Mutex
	pub  map[string]seenRev
	self map[string]seenRev
}

type seenRev struct {
	rev uint64
	at  time.Time
}

func newSeenEvents() *seenEvents {
	return &seenEvents{pub: make(map[string]seenRev), self: make(map[string]seenRev)}
}

func (e *seenEvents) of(self bool) map[string]seenRev {
	if self {
		return e.self
	}
	return e.pub
}

// noteAll records the events a writer reports it published.
func (e *seenEvents) noteAll(rep *presence.Published) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	noteNewer(e.pub, rep.Pub, now)
	noteNewer(e.self, rep.Self, now)
}

// noteNewer records in m, at now, each reported revision no older than
// the one it holds for its user.
func noteNewer(m map[string]seenRev, reported map[string]uint64, now time.Time) {
	for user, rev := range reported {
		if rev >= m[user].rev {
			m[user] = seenRev{rev, now}
		}
	}
}

// has reports whether an event of user at revision rev, or a newer one,
// was published.
func (e *seenEvents) has(user string, self bool, rev uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.of(self)[user].rev >= rev
}

// prune forgets what was seen before t.
func (e *seenEvents) prune(t time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range []map[string]seenRev{e.pub, e.self} {
		for u, r := range m {
			if r.at.Before(t) {
				delete(m, u)
			}
		}
	}
}
