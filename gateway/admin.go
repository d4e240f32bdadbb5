package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/presence"
)

// startAdmin registers the gateway's micro service, greendot-gateway, with
// its endpoints: info, kick and watchers on every gateway (broadcast), and
// conns answered by one gateway from the buckets. addr is the listen
// address, for the info.
func (s *Service) startAdmin(addr string) (*admin.Server, error) {
	cfg := &s.cfg
	return admin.Start(s.nc, admin.ServiceConfig{
		Name:        admin.GatewayService,
		Description: "greendot gateway: client WebSockets, subscriptions and delivery",
		InfoSubject: admin.GatewayInfoSubject,
		ID:          cfg.ID,
		Config: map[string]any{
			"addr":               addr,
			"policy":             string(cfg.Policy),
			"dev_auth":           cfg.DevAuth,
			"jwt":                cfg.Tokens != nil,
			"conn_ttl":           cfg.ConnTTL.String(),
			"lease_ttl":          cfg.LeaseTTL.String(),
			"heartbeat_interval": cfg.HeartbeatInterval.String(),
			"offline_grace":      cfg.OfflineGrace.String(),
			"background_grace":   cfg.BackgroundGrace.String(),
			"away_after":         cfg.AwayAfter.String(),
			"batch_interval":     cfg.BatchInterval.String(),
			"batch_pace":         cfg.BatchPace.String(),
			"max_conns":          cfg.MaxConns,
			"max_conns_per_user": cfg.MaxConnsPerUser,
			"max_subscriptions":  cfg.MaxSubscriptions,
			"max_message_size":   cfg.MaxMessageSize,
			"ws_compression":     !cfg.NoCompression,
			"rate_limit":         cfg.RateLimit,
			"drain_period":       cfg.DrainPeriod.String(),
			"replicas":           max(cfg.Buckets.Replicas, 1),
		},
		Load:   s.adminLoad,
		Ready:  s.Ready,
		Logger: s.log,
		Endpoints: []admin.Endpoint{
			{Name: admin.KickEndpoint, Subject: admin.GatewayKickSubject, Broadcast: true, Handle: s.kickRequest},
			{Name: admin.WatchersEndpoint, Subject: admin.GatewayWatchersSubject, Broadcast: true, Handle: s.watchersRequest},
			{Name: admin.ConnsEndpoint, Subject: admin.GatewayConnsSubject, Handle: s.connsRequest},
		},
	})
}

// adminLoad reports what the gateway holds now. It must not block: micro
// calls it under its lock.
func (s *Service) adminLoad() map[string]any {
	load := map[string]any{
		"connections":         s.registry.len(),
		"users":               s.registry.userCount(),
		"watched_users":       s.hub.Len(),
		"pending_deliveries":  s.scheduler.Pending(),
		"draining":            s.draining.Load(),
		"kv_writes_in_flight": s.keys.inFlight(),
		"all_watchers":        0,
	}
	if s.online != nil {
		load["all_watchers"] = s.online.allCount()
	}
	return load
}

// kickRequest closes the sockets of a user (or one connection) that this
// gateway holds, with the request's close code and reason. Their keys live
// out the offline grace, as after any clean close.
func (s *Service) kickRequest(ctx context.Context, data []byte) (any, error) {
	req, err := admin.ParseKickRequest(data)
	if err != nil {
		return nil, err
	}
	closed := []string{}
	for _, c := range s.registry.userConns(req.UserID) {
		if req.ConnID != "" && c.connID != req.ConnID || c.closed.Load() {
			continue
		}
		s.end(c, endClean, ws.StatusCode(req.Code), req.Reason)
		closed = append(closed, c.connID)
	}
	if len(closed) > 0 {
		s.metrics.kicks.Add(float64(len(closed)))
		s.log.LogAttrs(ctx, slog.LevelInfo, "connections kicked", attrUser(req.UserID),
			slog.Int("conns", len(closed)), attrCode(req.Code), attrReason(req.Reason))
	}
	return admin.KickReply{Gateway: s.cfg.ID, UserID: req.UserID, Closed: closed, Code: req.Code}, nil
}

// watchersRequest lists this gateway's sockets that receive a user's
// presence changes.
func (s *Service) watchersRequest(_ context.Context, data []byte) (any, error) {
	req, err := admin.ParseUserRequest(data)
	if err != nil {
		return nil, err
	}
	conns := s.hub.WatchersOf(req.UserID)
	reply := admin.WatchersReply{
		Gateway: s.cfg.ID,
		UserID:  req.UserID,
		// Under the everyone policy one subscription carries every user's
		// events; otherwise the hub holds one per watched user.
		Subscribed: len(conns) > 0 || s.cfg.Policy == PolicyEveryone,
		Watchers:   make([]admin.Watcher, 0, len(conns)),
	}
	for _, w := range conns {
		reply.Watchers = append(reply.Watchers, watcherOf(w.(*conn), false))
	}
	if s.online != nil {
		for _, c := range s.online.allWatchers() {
			reply.Watchers = append(reply.Watchers, watcherOf(c, true))
		}
	}
	slices.SortFunc(reply.Watchers, func(a, b admin.Watcher) int {
		return cmp.Or(cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.ConnID, b.ConnID))
	})
	return reply, nil
}

func watcherOf(c *conn, all bool) admin.Watcher {
	return admin.Watcher{UserID: c.userID, ConnID: c.connID, Device: c.device, Since: time.UnixMilli(c.since).UTC(), All: all}
}

// connsRequest reads a user's status record and connection keys, and
// reports every connection either of them knows.
func (s *Service) connsRequest(ctx context.Context, data []byte) (any, error) {
	req, err := admin.ParseUserRequest(data)
	if err != nil {
		return nil, err
	}
	if s.store == nil {
		return nil, fmt.Errorf("%w: the gateway is starting", admin.ErrUnavailable)
	}
	rec, rev, err := s.store.Status(ctx, req.UserID)
	if err != nil && !errors.Is(err, presence.ErrNotFound) {
		return nil, fmt.Errorf("%w: read status of %q: %v", admin.ErrUnavailable, req.UserID, err)
	}
	if errors.Is(err, presence.ErrNotFound) {
		rec = presence.Record{}
	}
	keys, err := s.store.UserConns(ctx, req.UserID)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", admin.ErrUnavailable, err)
	}
	leased, err := s.store.UserLeaseConns(ctx, req.UserID)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", admin.ErrUnavailable, err)
	}
	for k, c := range leased {
		keys[k.ConnID] = c
	}
	// A listing can miss a key written while it runs: confirm every
	// absence with a read from the stream leader.
	for id, ci := range rec.Conns {
		if _, ok := keys[id]; ok {
			continue
		}
		var k presence.ConnRecord
		if ci.Lease != "" {
			k, _, err = s.store.LeaseConnRecord(ctx, presence.LeaseConn{Gateway: ci.Gateway, Epoch: ci.Lease, UserID: req.UserID, ConnID: id})
		} else {
			k, _, err = s.store.Conn(ctx, req.UserID, id)
		}
		switch {
		case err == nil:
			keys[id] = k
		case !errors.Is(err, presence.ErrNotFound):
			return nil, fmt.Errorf("%w: %v", admin.ErrUnavailable, err)
		}
	}
	return connsReply(req.UserID, &rec, rev, keys), nil
}

// activeAt returns the last activity a key of the earlier shape carries.
func activeAt(k *presence.ConnRecord) *time.Time {
	if k.ActiveAt == 0 {
		return nil
	}
	t := time.UnixMilli(k.ActiveAt).UTC()
	return &t
}

// connsReply merges a user's status record (read at revision rev) with
// the connection keys read after it.
func connsReply(userID string, rec *presence.Record, rev uint64, keys map[string]presence.ConnRecord) admin.ConnsReply {
	r := admin.ConnsReply{
		UserID:   userID,
		Status:   cmp.Or(rec.Status, presence.Offline),
		Public:   cmp.Or(rec.Public, presence.Offline),
		Chosen:   rec.Chosen,
		Devices:  rec.Devices,
		Revision: rev,
		Conns:    []admin.ConnInfo{},
	}
	if rec.Since != 0 {
		t := time.UnixMilli(rec.Since).UTC()
		r.Since = &t
	}
	if rec.LastSeen != 0 {
		t := time.Unix(rec.LastSeen, 0).UTC()
		r.LastSeen = &t
	}
	for id, c := range rec.Conns {
		ci := admin.ConnInfo{
			ConnID: id, Gateway: c.Gateway, Lease: c.Lease, Device: c.Device, Platform: string(c.Platform), Since: time.UnixMilli(c.Since).UTC(),
			Idle: c.Idle, Closing: c.Closing, InRecord: true,
		}
		if k, ok := keys[id]; ok {
			ci.KeyLive = true
			ci.ActiveAt = activeAt(&k)
		}
		r.Conns = append(r.Conns, ci)
	}
	for id, k := range keys {
		if _, ok := rec.Conns[id]; ok {
			continue
		}
		// A key the record does not count (yet): its gateway is between
		// creating it and adding it to the record, or the record lost it.
		r.Conns = append(r.Conns, admin.ConnInfo{
			ConnID: id, Gateway: k.Gateway, Lease: k.Lease, Device: k.Device, Platform: string(k.Platform), Since: time.UnixMilli(k.Since).UTC(),
			ActiveAt: activeAt(&k), Idle: k.Idle, Closing: k.Closing, KeyLive: true,
		})
	}
	slices.SortFunc(r.Conns, func(a, b admin.ConnInfo) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.ConnID, b.ConnID))
	})
	return r
}
