package webhook

import (
	"context"
	"errors"

	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/presence"
)

// ErrNotReady means the process has not opened its buckets yet, or is
// stopping.
var ErrNotReady = errors.New("webhooks: not ready")

// Ready reports whether the process runs: its buckets are open and its
// NATS connection is up. It does not say whether the endpoint answers:
// the failures and lag metrics do. It is safe for concurrent use;
// --metrics-listen serves it on GET /readyz.
func (s *Service) Ready(ctx context.Context) error {
	return s.consumer.Ready(ctx)
}

// adminConfig describes the process's micro service, greendot-webhooks,
// with its info endpoint. The secret is never shown.
func (s *Service) adminConfig() admin.ServiceConfig {
	return admin.ServiceConfig{
		Name:        admin.WebhooksService,
		Description: "greendot webhooks: status transitions POSTed to an endpoint",
		InfoSubject: admin.WebhooksInfoSubject,
		Config: map[string]any{
			"url":           s.cfg.redactedURL(),
			"consumer":      s.cfg.Consumer,
			"bucket":        presence.StatusBucket,
			"invisible":     string(s.cfg.Invisible),
			"batch_size":    s.cfg.BatchSize,
			"batch_wait":    s.cfg.BatchWait.String(),
			"timeout":       s.cfg.Timeout.String(),
			"min_backoff":   s.cfg.MinBackoff.String(),
			"max_backoff":   s.cfg.MaxBackoff.String(),
			"give_up_after": s.cfg.GiveUpAfter.String(),
			"rate_limit":    s.cfg.RateLimit,
			"ack_wait":      s.cfg.AckWait.String(),
			"pinned_ttl":    s.cfg.PinnedTTL.String(),
		},
		Load: func() map[string]any {
			return map[string]any{"cached_users": s.cached.Load(), "resync_users": s.resync.pending.Load()}
		},
		Ready:  s.Ready,
		Logger: s.log,
	}
}
