package webhook

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/presence"
)

// A dead-lettered batch's events are never sent again, so the endpoint
// keeps what it had of those users: one who went offline while the
// endpoint was down for longer than GiveUpAfter would stay online there
// until their next change, maybe for good. So a process remembers the
// users of every batch it dead-letters and, once the endpoint takes
// deliveries again, sends each one's current state: the record read from
// presence_status, made an event by EventOf with the record's current
// revision. A receiver that keeps the highest revision per user takes it,
// and drops the older events of the user that may still come after it.
//
// Rounds of at most BatchSize users go one at a time, from work's
// goroutine, between batches: the first MinBackoff after a dead letter,
// the next at once after a round or a batch the endpoint took, and after
// a round that failed a backoff that doubles up to MaxBackoff. A user is
// forgotten once their current state is delivered, once a newer event of
// theirs is (it tells the endpoint at least as much), when there is no
// record to send, or when their state still has not gone through
// GiveUpAfter after their last dead letter. A round the endpoint refuses
// for good (a 4xx) is split: the next ones carry half as many users, down
// to one, so that a user the endpoint will never take holds no other up;
// rounds that go through grow back.
//
// The users are kept in presence_webhook_resync too, one key per consumer
// and user (its revision, its time that of the last dead letter), written
// with the dead letter and purged once the user is forgotten. A process
// takes its consumer's keys when it starts and when it is handed the
// consumer (it takes over from one that stopped or died), so that no
// user is lost with a process. More than one process may then send a
// user's current state, which is safe: each event carries the record's
// current revision. A user whose key could not be written lives in the
// process's memory only; the process logs them when it stops.

// maxResync bounds how many users of dead-lettered batches a process
// remembers; a variable so that tests can lower it.
var maxResync = 100_000

// resync holds the users of dead-lettered batches until their current
// state is delivered. Only work's goroutine touches it; pending is read
// by the metrics too.
type resync struct {
	limit int
	users map[string]*remembered
	// queue holds users in the order they are tried, each with the ticket
	// it was queued with; an entry whose ticket is no longer its user's
	// (the user was forgotten, or queued again) is left over and skipped.
	queue  []queued
	ticket uint64

	// due is when the next round may go: zero while no user is
	// remembered.
	due time.Time
	// backoff is the wait after the next round that fails.
	backoff time.Duration
	// size is how many users the next round carries, at most batch
	// (BatchSize).
	size, batch int
	// refused says the last round was refused for good: a batch the
	// endpoint takes does not bring the next round forward then.
	refused bool

	// gone are the users forgotten whose keys are still to be purged.
	gone []string

	// pending is len(users), for the metric and the info endpoint.
	pending atomic.Int64
}

// remembered is a user of a dead-lettered batch.
type remembered struct {
	rev    uint64    // the newest revision of the user dead-lettered
	since  time.Time // when the last batch with the user was dead-lettered
	ticket uint64    // the user's entry in the queue
	// stored says the user's key in presence_webhook_resync says rev.
	stored bool
}

// resyncValue is the value of a key in presence_webhook_resync.
type resyncValue struct {
	Rev uint64 `json:"rev"`
}

// keptUser is a user as a key in presence_webhook_resync has them.
type keptUser struct {
	user  string
	rev   uint64
	since time.Time
}

type queued struct {
	user   string
	ticket uint64
}

func newResync(limit, size int) resync {
	return resync{limit: limit, users: make(map[string]*remembered), size: size, batch: size}
}

// push queues a remembered user at the back.
func (r *resync) push(user string, m *remembered) {
	r.ticket++
	m.ticket = r.ticket
	r.users[user] = m
	r.queue = append(r.queue, queued{user, r.ticket})
	// Drop the left-over entries once they outnumber the live ones.
	if len(r.queue) > 2*len(r.users)+64 {
		live := r.queue[:0]
		for _, q := range r.queue {
			if m, ok := r.users[q.user]; ok && m.ticket == q.ticket {
				live = append(live, q)
			}
		}
		clear(r.queue[len(live):])
		r.queue = live
	}
	r.pending.Store(int64(len(r.users)))
}

// forget drops a user, and notes their key for purging. Once none is left
// the rounds start afresh.
func (r *resync) forget(user string) {
	if m, ok := r.users[user]; ok && m.stored {
		r.gone = append(r.gone, user)
	}
	delete(r.users, user)
	r.pending.Store(int64(len(r.users)))
	if len(r.users) == 0 {
		r.queue, r.due, r.refused, r.size = nil, time.Time{}, false, r.batch
	}
}

// take returns up to n remembered users from the front of the queue; they
// stay remembered, out of the queue until requeued or forgotten.
func (r *resync) take(n int) []string {
	var users []string
	for len(r.queue) > 0 && len(users) < n {
		q := r.queue[0]
		r.queue = r.queue[1:]
		if m, ok := r.users[q.user]; ok && m.ticket == q.ticket {
			users = append(users, q.user)
		}
	}
	return users
}

// adopt adds the users kept in presence_webhook_resync (by this process,
// or by another of the consumer's) that it does not remember: each as its
// key has it, unless its last dead letter was giveUp ago or more, or the
// bound is reached. It returns how many it added, and the users given up
// (whose keys it notes for purging) and those beyond the bound (whose
// keys stay), as user@rev.
func (r *resync) adopt(kept []keptUser, now time.Time, giveUp time.Duration) (added int, gaveUp, over []string) {
	for _, k := range kept {
		if m, ok := r.users[k.user]; ok {
			if k.rev >= m.rev {
				m.rev, m.stored = k.rev, true
			}
			continue
		}
		switch {
		case now.Sub(k.since) >= giveUp:
			gaveUp = append(gaveUp, userRev(k.user, k.rev))
			r.gone = append(r.gone, k.user)
		case len(r.users) >= r.limit:
			over = append(over, userRev(k.user, k.rev))
		default:
			r.push(k.user, &remembered{rev: k.rev, since: k.since, stored: true})
			added++
		}
	}
	return added, gaveUp, over
}

// remember notes the users of a dead-lettered batch, and keeps them in
// presence_webhook_resync; when none was remembered before, it has the
// first round go MinBackoff later. Users beyond the bound are counted and
// logged, not remembered.
func (s *Service) remember(batch []*item) {
	// A user forgotten earlier and dead-lettered again keeps their key.
	s.purgeForgotten()
	r := &s.resync
	now := time.Now()
	var over, touched []string
	for _, it := range batch {
		u := it.ev.UserID
		if m, ok := r.users[u]; ok {
			m.rev, m.since = max(m.rev, it.ev.Rev), now
			m.stored = false
			touched = append(touched, u)
			continue
		}
		if len(r.users) >= r.limit {
			over = append(over, userRev(u, it.ev.Rev))
			continue
		}
		r.push(u, &remembered{rev: it.ev.Rev, since: now})
		touched = append(touched, u)
	}
	s.keep(touched)
	s.unsent("overflow", "webhook resync full: users of a dead letter not remembered; their current state will not be sent",
		over, "limit", r.limit)
	if r.due.IsZero() && len(r.users) > 0 {
		r.backoff = s.cfg.MinBackoff
		r.due = now.Add(r.backoff)
	}
}

// resyncDelivered forgets the remembered users a delivered batch carried
// a newer revision of, and has the next round go at once: the endpoint
// takes deliveries again (but when it refused the last round for good).
func (s *Service) resyncDelivered(batch []*item) {
	r := &s.resync
	if len(r.users) == 0 {
		return
	}
	defer s.purgeForgotten()
	for _, it := range batch {
		if m, ok := r.users[it.ev.UserID]; ok && it.ev.Rev > m.rev {
			r.forget(it.ev.UserID)
			s.metrics.resyncUsers.WithLabelValues("superseded").Inc()
		}
	}
	if len(r.users) > 0 && !r.refused {
		r.due, r.backoff = time.Now(), s.cfg.MinBackoff
	}
}

// resyncDue returns a channel that fires when the next round may go, or
// nil when no user is remembered. stop releases its timer.
func (s *Service) resyncDue() (due <-chan time.Time, stop func()) {
	if s.resync.due.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(s.resync.due))
	return t.C, func() { t.Stop() }
}

// resyncRound sends, in one POST, the current state of the users longest
// waiting, if a round is due, and schedules the next. It returns false
// when the process stops first; the users stay remembered then.
func (s *Service) resyncRound() bool {
	r := &s.resync
	if r.due.IsZero() || time.Now().Before(r.due) {
		return true
	}
	defer s.purgeForgotten()
	users := r.take(r.size)
	if len(users) == 0 {
		return true
	}
	events, err := s.current(users)
	if err != nil {
		if s.quitting.Err() != nil {
			s.requeue(users)
			return false
		}
		s.log.Warn("webhook resync: cannot read the users' records; retrying", "err", err, "users", len(users))
		s.resyncFailed(users, 0, 0)
		return true
	}
	// Those with no record to send are forgotten already.
	users = users[:0]
	for _, ev := range events {
		users = append(users, ev.UserID)
	}
	if len(events) == 0 {
		s.resyncWent()
		return true
	}
	body, err := json.Marshal(Batch{Events: events})
	if err != nil { // cannot happen: events are plain values
		s.log.Error("webhook resync: encode", "err", err)
		s.resyncFailed(users, 0, 0)
		return true
	}
	a, ok := s.attempt(body, 1)
	switch {
	case !ok:
		s.requeue(users)
		return false
	case a.delivered():
		for _, u := range users {
			r.forget(u)
		}
		s.metrics.resyncUsers.WithLabelValues("sent").Add(float64(len(users)))
		s.log.Info("webhook resync: users' current state delivered", "users", keysOf(events), "remembered", len(r.users))
		r.refused = false
		r.size = min(2*r.size, r.batch)
		s.resyncWent()
		return true
	}
	if a.refused() {
		r.refused = true
		r.size = max(r.size/2, 1)
	}
	s.resyncFailed(users, a.status, a.retryAfter)
	if len(r.users) > 0 {
		s.log.Warn("webhook resync failed; retrying", "status", a.status, "err", a.err, "users", len(users),
			"retry_in", time.Until(r.due).Round(time.Millisecond), "next_users", r.size)
	}
	return true
}

// current reads the users' records and returns their events, in the order
// of their revisions. A user with no record to send (never written, or not
// greendot's) is forgotten and counted; a deleted record is sent as
// offline. Any other error of a read is returned; the users stay
// remembered.
func (s *Service) current(users []string) ([]Event, error) {
	store := s.store.Load()
	if store == nil {
		return nil, ErrNotReady
	}
	ctx, cancel := context.WithTimeout(s.quitting, s.natsTimeout())
	defer cancel()
	events := make([]Event, 0, len(users))
	for _, u := range users {
		rec, rev, err := store.Status(ctx, u)
		switch {
		case err == nil:
			events = append(events, EventOf(u, &rec, rev, rec.Updated, s.cfg.Invisible))
		case errors.Is(err, presence.ErrNotFound) && rev > 0:
			// Deleted by hand: offline. When is not at hand; the
			// receiver goes by the revision.
			events = append(events, EventOf(u, nil, rev, time.Now().UnixMilli(), s.cfg.Invisible))
		case errors.Is(err, presence.ErrNotFound) || undecodable(err):
			s.resync.forget(u)
			s.metrics.resyncUsers.WithLabelValues("gone").Inc()
			s.log.Warn("webhook resync: no record to send", "user_id", u, "err", err)
		default:
			return nil, err
		}
	}
	slices.SortFunc(events, func(a, b Event) int { return cmp.Compare(a.Rev, b.Rev) })
	return events, nil
}

// undecodable reports whether err says a record is not JSON of a Record.
func undecodable(err error) bool {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return errors.As(err, &syntax) || errors.As(err, &typ)
}

// requeue puts users taken for a round, and still remembered, back at the
// front of the queue, in their order.
func (s *Service) requeue(users []string) {
	r := &s.resync
	var front []queued
	for _, u := range users {
		if m, ok := r.users[u]; ok {
			front = append(front, queued{u, m.ticket})
		}
	}
	r.queue = append(front, r.queue...)
}

// resyncWent schedules the round after one that went through (or had
// nothing to send): at once.
func (s *Service) resyncWent() {
	r := &s.resync
	r.backoff = s.cfg.MinBackoff
	if len(r.users) > 0 {
		r.due = time.Now()
	}
}

// resyncFailed schedules the round after one that failed: after the
// backoff, or the endpoint's Retry-After, up to MaxBackoff. The round's
// users whose state has not gone through GiveUpAfter after their last
// dead letter are forgotten, counted and logged; the others go to the
// back of the queue, so that the next round carries others first.
func (s *Service) resyncFailed(users []string, status int, retryAfter time.Duration) {
	r := &s.resync
	now := time.Now()
	var gaveUp []string
	for _, u := range users {
		m, ok := r.users[u]
		switch {
		case !ok:
		case now.Sub(m.since) >= s.cfg.GiveUpAfter:
			gaveUp = append(gaveUp, userRev(u, m.rev))
			r.forget(u)
		default:
			r.push(u, m)
		}
	}
	s.unsent("given_up", "webhook resync given up: users' current state not delivered", gaveUp, "status", status)
	if len(r.users) == 0 {
		return
	}
	r.due = now.Add(retryWait(r.backoff, retryAfter, s.cfg.MaxBackoff))
	r.backoff = min(2*r.backoff, s.cfg.MaxBackoff)
}

// abandonResync logs the users still remembered when the process stops:
// those kept in presence_webhook_resync, which the next process takes,
// and those not, whose current state nobody will send.
func (s *Service) abandonResync() {
	r := &s.resync
	var lost []string
	kept := 0
	for u, m := range r.users {
		if m.stored {
			kept++
			continue
		}
		lost = append(lost, userRev(u, m.rev))
	}
	if kept > 0 {
		s.log.Info("webhook resync: the process stops; users whose current state is still to be sent are kept in "+
			presence.WebhookResyncBucket+" for the next process", "count", kept)
	}
	if len(lost) > 0 {
		slices.Sort(lost)
		s.log.Error("webhook resync abandoned: the process stops; these users' current state is not sent",
			"count", len(lost), "users", strings.Join(lost, ","))
	}
}

// unsent counts under result the users (user@rev) whose current state
// this process will not send, and logs them with msg and attrs.
func (s *Service) unsent(result, msg string, users []string, attrs ...any) {
	if len(users) == 0 {
		return
	}
	s.metrics.resyncUsers.WithLabelValues(result).Add(float64(len(users)))
	s.log.Error(msg, append(attrs, "count", len(users), "users", strings.Join(users, ","))...)
}

// natsTimeout bounds a resync's reads and writes in NATS.
func (s *Service) natsTimeout() time.Duration { return max(s.cfg.Timeout, 5*time.Second) }

// prepare binds presence_webhook_resync, creating it if it is missing, and
// takes the users the consumer's processes kept there, before the process
// becomes ready.
func (s *Service) prepare(ctx context.Context) error {
	kv, err := presence.EnsureBucket(ctx, *s.js.Load(), presence.WebhookResyncBucket, s.cfg.Buckets)
	if err != nil {
		return fmt.Errorf("%w (the webhooks processes keep the users of their dead letters there: `greendot buckets --feed` creates it)", err)
	}
	s.resyncKV = kv
	kept, err := s.listKept(ctx)
	if err != nil {
		return err
	}
	s.takeKept(kept)
	return nil
}

// reloadResync takes the users kept in presence_webhook_resync again, for
// a process just handed the consumer: the one before it may have kept
// more since this one started.
func (s *Service) reloadResync() {
	if s.resyncKV == nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.quitting, s.natsTimeout())
	defer cancel()
	kept, err := s.listKept(ctx)
	if err != nil {
		if s.quitting.Err() == nil {
			s.log.Warn("webhook resync: cannot read the users kept by the processes before this one; the next start takes them", "err", err)
		}
		return
	}
	s.takeKept(kept)
}

// listKept reads the consumer's keys in presence_webhook_resync. A key
// that names no user, or whose value is not a resyncValue, is logged and
// left.
func (s *Service) listKept(ctx context.Context) ([]keptUser, error) {
	bad := func(err error) error {
		return fmt.Errorf("read %s: %w", presence.WebhookResyncBucket, err)
	}
	w, err := s.resyncKV.WatchFiltered(ctx, []string{presence.ResyncKey(s.cfg.Consumer, ">")}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, bad(err)
	}
	defer func() { _ = w.Stop() }()
	prefix := presence.ResyncKey(s.cfg.Consumer, "")
	var kept []keptUser
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, bad(errors.New("the listing stopped"))
			}
			if e == nil {
				return kept, nil
			}
			user, _ := strings.CutPrefix(e.Key(), prefix)
			var v resyncValue
			if err := json.Unmarshal(e.Value(), &v); err != nil || !presence.ValidUserID(user) || v.Rev == 0 {
				s.log.Warn("webhook resync: ignoring a key that is not a user's", "bucket", presence.WebhookResyncBucket, "key", e.Key(), "value", string(e.Value()))
				continue
			}
			kept = append(kept, keptUser{user: user, rev: v.Rev, since: e.Created()})
		case <-ctx.Done():
			return nil, bad(ctx.Err())
		}
	}
}

// takeKept remembers the users kept that this process does not, gives up
// those whose last dead letter is GiveUpAfter old, and has a round go at
// once if it took any.
func (s *Service) takeKept(kept []keptUser) {
	r := &s.resync
	now := time.Now()
	added, gaveUp, over := r.adopt(kept, now, s.cfg.GiveUpAfter)
	defer s.purgeForgotten()
	if added > 0 {
		s.metrics.resyncUsers.WithLabelValues("taken_over").Add(float64(added))
		s.log.Info("webhook resync: users of earlier dead letters taken over from "+presence.WebhookResyncBucket,
			"count", added, "remembered", len(r.users))
		r.due, r.backoff, r.refused = now, s.cfg.MinBackoff, false
	}
	s.unsent("given_up", "webhook resync given up: users' current state not delivered", gaveUp)
	s.unsent("overflow", "webhook resync full: users kept by an earlier process not remembered; their keys stay for the next start",
		over, "limit", r.limit)
}

// keep writes the keys of users just remembered. A user whose key is not
// written stays remembered in memory only.
func (s *Service) keep(users []string) {
	if s.resyncKV == nil || len(users) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(s.quitting, s.natsTimeout())
	defer cancel()
	for i, u := range users {
		m, ok := s.resync.users[u]
		if !ok || m.stored {
			continue
		}
		val, _ := json.Marshal(resyncValue{Rev: m.rev}) // cannot fail
		if _, err := s.resyncKV.Put(ctx, presence.ResyncKey(s.cfg.Consumer, u), val); err != nil {
			s.log.Warn("webhook resync: cannot keep users of a dead letter in "+presence.WebhookResyncBucket+
				"; they are remembered by this process only", "err", err, "users", len(users)-i)
			return
		}
		m.stored = true
	}
}

// purgeForgotten purges the keys of the users forgotten. A key left (NATS
// failed) costs a later process one more send of the user's current state.
func (s *Service) purgeForgotten() {
	r := &s.resync
	if len(r.gone) == 0 {
		return
	}
	gone := r.gone
	r.gone = nil
	store := s.store.Load()
	if s.resyncKV == nil || store == nil || s.quitting.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.quitting, s.natsTimeout())
	defer cancel()
	for i, u := range gone {
		if err := s.resyncKV.Purge(ctx, presence.ResyncKey(s.cfg.Consumer, u), jetstream.PurgeTTL(store.MarkerTTL())); err != nil {
			s.log.Warn("webhook resync: cannot purge the keys of users forgotten; a later process sends their current state again",
				"bucket", presence.WebhookResyncBucket, "err", err, "users", len(gone)-i)
			return
		}
	}
}

// keysOf names events as user@rev, for logs.
func keysOf(events []Event) string {
	var b strings.Builder
	for i, ev := range events {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(userRev(ev.UserID, ev.Rev))
	}
	return b.String()
}
