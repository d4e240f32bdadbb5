package gateway

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/pkg/presence"
)

// wakeup tells a goroutine that work waits for it: a signal sent while it
// works has it look once more.
type wakeup chan struct{}

func newWakeup() wakeup { return make(wakeup, 1) }

// signal wakes the goroutine, or leaves it to look again.
func (w wakeup) signal() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// lostSubs are subscriptions that NATS dropped messages of (a slow
// consumer), each with what must be read again for it: a watched user's
// state, every user's (the everyone policy's one subscription), the
// gateway's own users' (their self events), or a room's members. It is
// safe for concurrent use.
//
// NATS tells of the first message it drops of a subscription, not of
// those it drops after it until one gets through: so a subscription stays
// noted once what it carries was read, and is read again if it dropped
// more since, until one of its messages got through with none dropped
// since (a drop after that is told of again). A subscription still
// dropping is read once it has dropped none for lostRecheck, not at every
// look: a read taken while messages are still being lost is stale at
// once, and reading every user again each time would add to what the
// gateway is behind on.
type lostSubs[T any] struct {
	mu   sync.Mutex
	subs map[*nats.Subscription]*lostSub[T]
	wake wakeup
}

// lostSub is a subscription that dropped messages.
type lostSub[T any] struct {
	what T // what to read again
	// due reports that what it carries must be read once it drops no
	// more.
	due bool
	// dropped and delivered are the subscription's counts at the last
	// look.
	dropped   int
	delivered int64
}

// lostEvent is what a dispatcher's subscription carries.
type lostEvent struct {
	user      string // the watched user, for a user's subscription
	all, self bool   // the subscription to every user's events, or to self events
}

// lostRecheck is how often the subscriptions noted in lostSubs are looked
// at for drops NATS did not tell of, and how long one must drop none
// before what it carries is read.
const lostRecheck = 250 * time.Millisecond

func newLostSubs[T any]() *lostSubs[T] {
	return &lostSubs[T]{subs: make(map[*nats.Subscription]*lostSub[T]), wake: newWakeup()}
}

// note records that sub dropped messages, with what it carries, and wakes
// the reader.
func (l *lostSubs[T]) note(sub *nats.Subscription, what T) {
	l.mu.Lock()
	if ls, ok := l.subs[sub]; ok {
		ls.due = true
	} else {
		// Dropping now: looked at again before it is read.
		l.subs[sub] = &lostSub[T]{what: what, due: true, dropped: -1}
	}
	l.mu.Unlock()
	l.wake.signal()
}

// take returns what to read now: what the subscriptions carry that
// dropped messages and none since the last look, which it counts as read.
// It forgets the subscriptions that ended, or got a message through with
// none dropped since what they carry was read. noted reports whether some
// are still noted.
func (l *lostSubs[T]) take() (due []T, noted bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for sub, ls := range l.subs {
		dropped, err := sub.Dropped()
		delivered, err2 := sub.Delivered()
		switch {
		case err != nil || err2 != nil:
			delete(l.subs, sub) // ended
		case dropped != ls.dropped:
			// Still dropping: read it once it stops.
			ls.due, ls.dropped, ls.delivered = true, dropped, delivered
		case ls.due:
			ls.due, ls.delivered = false, delivered
			due = append(due, ls.what)
		case delivered > ls.delivered:
			delete(l.subs, sub)
		}
	}
	return due, len(l.subs) > 0
}

// each calls read with what to read again, until ctx is canceled: when a
// drop is noted, and every lostRecheck while subscriptions stay noted.
func (l *lostSubs[T]) each(ctx context.Context, read func(due []T)) {
	t := time.NewTimer(lostRecheck)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-t.C:
		}
		due, noted := l.take()
		if len(due) > 0 {
			read(due)
		}
		if noted {
			t.Reset(lostRecheck)
		}
	}
}

// catchDrops has the gateway hear of the messages NATS drops for it,
// because it fell behind the messages of a subscription (a slow
// consumer), on the connection's asynchronous error handler, until the
// returned function restores the handler it wraps; other errors go on to
// that handler. What a drop lost is read again: a watched user's state
// (readLost), the gateway's users' own states, a room's members (the
// rooms' hub); lost room signals are only counted.
func (s *Service) catchDrops() (restore func()) {
	prev := s.nc.ErrorHandler()
	s.nc.SetErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
		if sub != nil && errors.Is(err, nats.ErrSlowConsumer) && (s.rooms.dropped(sub) || s.eventsDropped(sub)) {
			return
		}
		if prev != nil {
			prev(nc, sub, err)
		}
	})
	return func() { s.nc.SetErrorHandler(prev) }
}

var eventSubjectPrefix = presence.EventSubject("")

// eventsDropped notes that NATS dropped events of sub, and reports whether
// sub is one of the dispatcher's: a channel subscription to this
// gateway's self events, or to presence events.
func (s *Service) eventsDropped(sub *nats.Subscription) bool {
	if sub.Type() != nats.ChanSubscription {
		return false
	}
	subject := sub.Subject
	user, perUser := strings.CutPrefix(subject, eventSubjectPrefix)
	switch {
	case subject == presence.SelfSubject(s.cfg.ID):
		s.metrics.natsDrops.WithLabelValues("self").Inc()
		s.lost.note(sub, lostEvent{self: true})
	case subject == presence.EventWildcard:
		s.metrics.natsDrops.WithLabelValues("event").Inc()
		s.lost.note(sub, lostEvent{all: true})
	case perUser && presence.ValidUserID(user):
		s.metrics.natsDrops.WithLabelValues("event").Inc()
		s.lost.note(sub, lostEvent{user: user})
	default:
		return false
	}
	s.log.Warn("events dropped, the gateway fell behind: reading their users' state again", "subject", subject)
	return true
}

// readLost reads again, until ctx is canceled, the states whose events
// NATS dropped (see lostSubs), each until the read succeeds.
func (s *Service) readLost(ctx context.Context) {
	s.lost.each(ctx, func(due []lostEvent) {
		var users []string
		all, self := false, false
		for _, e := range due {
			switch {
			case e.all:
				all = true
			case e.self:
				self = true
			default:
				users = append(users, e.user)
			}
		}
		if all {
			users = s.hub.Users()
		}
		s.resyncUsers(ctx, users)
		if all && s.online != nil {
			s.resyncOnline(ctx)
		}
		if self {
			s.resyncSelf(ctx)
		}
	})
}

// resyncSelf reads the record of every user with a connection here, and
// delivers their own state to their connections through the dispatcher,
// where it is newer than what they were told. A read that fails is tried
// again until it succeeds.
func (s *Service) resyncSelf(ctx context.Context) {
	retryEach(ctx, s.registry.userIDs(), func(u string) error {
		rec, rev, err := s.store.Status(ctx, u)
		switch {
		case errors.Is(err, presence.ErrNotFound):
			return nil // written on connect: nothing to tell yet
		case err != nil:
			return err
		}
		ev := presence.SelfEvent{UserID: u, Status: rec.Status, Devices: rec.Devices, Custom: rec.Custom, Rev: rev}
		s.call(ctx, func() { s.deliverSelf(&ev) })
		return nil
	}, func(u string, err error, pause time.Duration) {
		s.log.Warn("resync own state", "user_id", u, "err", err, "retry_in", pause)
	})
}
