package gateway

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// readConcurrency bounds the status reads of one request in flight at
// once.
const readConcurrency = 16

// subscribe answers a subscribe message: presence_init with the current
// state of every allowed target, and a denied frame per refused one.
//
// Everything that needs NATS happens first, with no lock held on the
// socket: the authorizer decides and registers the subscriptions, then the
// snapshots are read. Changes that arrive meanwhile wait in the socket's
// box, held until presence_init is written, so that no batch overtakes it.
func (s *Service) subscribe(ctx context.Context, c *conn, m *protocol.ClientMessage) {
	if m.All {
		s.subscribeAll(ctx, c, m.ID)
		return
	}
	if len(m.UserIDs) == 0 {
		s.sendError(c, m.ID, protocol.CodeBadRequest, `subscribe needs "user_ids" (an array of user ids) or "all": true`)
		return
	}
	if len(m.UserIDs) > s.cfg.MaxSubscribeIDs {
		s.sendError(c, m.ID, protocol.CodeBadRequest, fmt.Sprintf("at most %d user ids per subscribe", s.cfg.MaxSubscribeIDs))
		return
	}
	var denied []protocol.Denied
	deny := func(user, reason string) {
		denied = append(denied, protocol.Denied{Type: protocol.TypeDenied, ID: m.ID, UserID: user, Reason: reason})
	}
	var candidates []string
	seen := make(map[string]bool, len(m.UserIDs))
	room := s.cfg.MaxSubscriptions - s.hub.Count(c)
	for _, u := range m.UserIDs {
		if seen[u] {
			continue
		}
		seen[u] = true
		if !presence.ValidUserID(u) {
			deny(u, protocol.ReasonInvalidUserID)
			continue
		}
		if !s.hub.Watching(c, u) {
			if room <= 0 {
				deny(u, protocol.ReasonTooManySubscriptions)
				continue
			}
			room--
		}
		candidates = append(candidates, u)
	}

	c.box.Hold()
	defer c.release()
	entries, refused, err := s.watch(ctx, c, candidates)
	if err != nil {
		s.reply(c, m.ID, err)
		return
	}
	for _, d := range refused {
		deny(d.User, d.Reason)
	}
	if hook := s.hooks.afterSnapshot.Load(); hook != nil {
		(*hook)(c.userID)
	}
	c.sock.Lock()
	defer c.sock.Unlock()
	// Settled under the socket's lock, as a revocation's denied is
	// written: one that lands before leaves its user out of presence_init,
	// one that lands after writes its denied after presence_init.
	users := s.settle(c, entries)
	if s.sendLocked(c, protocol.TypePresenceInit, &protocol.PresenceInit{
		Type: protocol.TypePresenceInit, ID: m.ID, Users: users,
	}) != nil {
		return
	}
	for i := range denied {
		if s.sendLocked(c, protocol.TypeDenied, &denied[i]) != nil {
			return
		}
	}
}

// watch has the authorizer decide and register c's subscriptions to
// targets, reads their snapshots, and returns them, to be settled, and
// the refused targets.
func (s *Service) watch(ctx context.Context, c *conn, targets []string) ([]hub.Entry, []denial, error) {
	if len(targets) == 0 {
		return nil, nil, nil
	}
	grants, refused, subscribed, err := s.authz.Subscribe(ctx, c, targets)
	if err != nil {
		return nil, nil, err
	}
	var denials []denial
	for _, d := range refused {
		denials = append(denials, denial{d.User, d.Reason})
	}
	if len(grants) == 0 {
		return nil, denials, nil
	}
	entries, err := s.snapshot(ctx, subscribed, grants)
	if err != nil {
		// The client is told nothing changed: the subscriptions this
		// subscribe made end, and those the socket had before go on.
		users := make([]string, len(grants))
		for i, g := range grants {
			users[i] = g.User
		}
		s.hub.Cancel(c, users)
		return nil, nil, err
	}
	return entries, denials, nil
}

// settle unblocks c's subscriptions to the users of entries, and returns
// the presence of each one c still watches, as it may see it. A change of
// theirs that waits in c's box is dropped first: it is no newer than what
// the answer shows, and written after it would show an older state.
// (While the subscriptions are blocked, the hub adds none.)
func (s *Service) settle(c *conn, entries []hub.Entry) []presence.Presence {
	for i := range entries {
		c.box.Remove(entries[i].Presence.UserID)
	}
	entries = s.hub.Settle(c, entries)
	out := make([]presence.Presence, len(entries))
	for i := range entries {
		out[i] = entries[i].Presence
	}
	return out
}

// denial is a refused subscription.
type denial struct{ User, Reason string }

// snapshot reads the presence of the granted users, in parallel. When the
// hub made a new NATS subscription, the server must know of it before the
// snapshot is read, or an event published in between is lost.
func (s *Service) snapshot(ctx context.Context, subscribed bool, grants []hub.Grant) ([]hub.Entry, error) {
	if subscribed {
		if err := s.nc.FlushWithContext(ctx); err != nil {
			return nil, fmt.Errorf("flush subscriptions: %w", err)
		}
	}
	entries := make([]hub.Entry, len(grants))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, gr := range grants {
		g.Go(func() error {
			p, rev, _, err := s.presenceOf(gctx, gr.User)
			entries[i] = hub.Entry{Presence: p, Rev: rev}
			return err
		})
	}
	return entries, g.Wait()
}

// subscribeAll answers a subscribe with "all": true.
func (s *Service) subscribeAll(ctx context.Context, c *conn, id string) {
	if !s.authz.Everyone() {
		s.sendDenied(c, id, "*", protocol.ReasonNotAllowed)
		return
	}
	c.box.Hold()
	defer c.release()
	users, count, err := s.online.subscribe(c, s.cfg.OnlineLimit)
	if err != nil {
		s.reply(c, id, err)
		return
	}
	hideLastSeen(users, s.authz.LastSeenOf(ctx, c.userID, userIDs(users)))
	s.send(c, protocol.TypePresenceInit, &protocol.PresenceInit{
		Type: protocol.TypePresenceInit, ID: id, Users: users, OnlineCount: &count,
	})
}
