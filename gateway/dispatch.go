package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/presence"
)

// dispatch reads the events NATS delivers to the gateway, in order, until
// ctx is canceled, and runs the functions given to call in order with
// them. It is the only goroutine that delivers the events of NATS; the
// self events of the gateway's own writes are delivered by their writers
// (handSelf).
func (s *Service) dispatch(ctx context.Context) {
	selfSubject := presence.SelfSubject(s.cfg.ID)
	for {
		var msg *nats.Msg
		select {
		case <-ctx.Done():
			return
		case fn := <-s.calls:
			fn()
			continue
		case msg = <-s.events:
		}
		s.metrics.eventsIn.Inc()
		if msg.Subject == selfSubject {
			var ev presence.SelfEvent
			if err := json.Unmarshal(msg.Data, &ev); err != nil {
				s.log.Warn("undecodable self event", "subject", msg.Subject, "err", err)
				continue
			}
			s.deliverSelf(&ev)
			continue
		}
		var ev presence.Event
		if err := json.Unmarshal(msg.Data, &ev); err != nil || !presence.ValidUserID(ev.UserID) {
			s.log.Warn("undecodable presence event", "subject", msg.Subject, "err", err)
			continue
		}
		s.deliver(&ev)
	}
}

// deliverSelf hands a self event from NATS (or read again after a drop)
// to the user's connections here, on the dispatcher. It is noted first: a
// connection that enters the registry after handSelf's walk is given it
// when it is listed.
func (s *Service) deliverSelf(ev *presence.SelfEvent) {
	s.keys.learnSelf(ev)
	s.handSelf(ev)
}

// handSelf hands a user's own state to the user's connections here. It
// runs for deliverSelf, and on a user's writer for the self events of the
// writer's own writes (presence.Publisher.HandOver), which the writer
// noted already: each connection keeps the newest revision it is given,
// whichever comes first.
func (s *Service) handSelf(ev *presence.SelfEvent) {
	for _, c := range s.registry.userConns(ev.UserID) {
		c.deliverSelf(ev.Rev, ev.Status, ev.Devices, ev.Custom)
		s.members.status(c, ev.Rev, ev.Status)
	}
}

// deliver hands a presence event to the sockets watching its user, and to
// global presence. It runs on the dispatcher.
func (s *Service) deliver(ev *presence.Event) {
	if dropped := s.hub.Deliver(ev); dropped > 0 {
		s.metrics.eventsDropped.Add(float64(dropped))
	}
	if s.online != nil {
		s.online.apply(ev)
	}
}

// call runs fn on the dispatcher, in order with the events, unless ctx
// ends first.
func (s *Service) call(ctx context.Context, fn func()) {
	select {
	case s.calls <- fn:
	case <-ctx.Done():
	}
}

// watchGraph applies the changes of the graph bucket that w sees until ctx
// is canceled, and stops w.
func (s *Service) watchGraph(ctx context.Context, w jetstream.KeyWatcher) {
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e != nil {
				s.authz.Changed(ctx, e.Key())
				s.graphChanged(e.Key())
			}
		}
	}
}

// graphChanged has global presence show a user again to the sockets
// watching everyone whose view of the user's last_seen a change of the
// graph bucket (by its key) may have changed: every one for a change of
// the user's settings, the followed user's for a follow edge from the
// user (a contact sees last_seen under the contacts setting).
func (s *Service) graphChanged(key string) {
	if s.online == nil {
		return
	}
	if x, y, ok := presence.ParseFollowKey(key); ok {
		s.online.reshow(x, y)
	} else if u, ok := presence.ParseSettingsKey(key); ok {
		s.online.reshow(u, "")
	}
}

// notifier tells sockets what the authorizer changed of their
// subscriptions (authz.Notifier).
type notifier struct{ s *Service }

// Revoked sends the socket a denied frame for a subscription that ended,
// after which none of user's changes may reach it. The hub hands it no
// more of them (the subscription was removed first), but one may wait in
// its box: it is dropped before the denied is written. A flush that took
// it already holds the socket's lock until it is written, so it goes out
// before the denied, never after.
func (n notifier) Revoked(w hub.Watcher, user, reason string) {
	c := w.(*conn)
	c.box.Remove(user)
	n.s.sendDenied(c, "", user, reason)
}

// Reshow reads user's presence once and delivers it to each socket again,
// as each may now see it. One read serves them all: the hub sends each the
// newest state it knows, should a newer one have reached a socket since.
func (n notifier) Reshow(user string, ws []hub.Watcher) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	p, rev, _, err := n.s.presenceOf(ctx, user)
	if err != nil {
		n.s.log.Warn("resend presence", "target", user, "sockets", len(ws), "err", err)
		return
	}
	for _, w := range ws {
		n.s.hub.Resend(w, p, rev)
	}
}

// presenceOf reads what others see of a user, with last_seen, the
// revision of the status record it comes from, and when that was written
// (unix ms).
func (s *Service) presenceOf(ctx context.Context, userID string) (presence.Presence, uint64, int64, error) {
	start := time.Now()
	rec, rev, err := s.store.Status(ctx, userID)
	s.metrics.kvLatency.WithLabelValues("get_status").Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, presence.ErrNotFound):
		return presence.Presence{UserID: userID, Status: presence.Offline}, rev, 0, nil
	case err != nil:
		return presence.Presence{}, 0, 0, err
	}
	return rec.Presence(userID), rev, rec.Updated, nil
}
