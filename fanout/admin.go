package fanout

import (
	"context"
	"errors"

	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/presence"
)

// ErrNotReady means the fanout has not opened its buckets yet, or is
// stopping.
var ErrNotReady = errors.New("fanout: not ready")

// Ready reports whether the fanout runs: its buckets are open and its NATS
// connection is up. It is safe for concurrent use; --metrics-listen serves
// it on GET /readyz.
func (s *Service) Ready(ctx context.Context) error {
	return s.consumer.Ready(ctx)
}

// adminConfig describes the fanout's micro service, greendot-fanout, with
// its info endpoint.
func (s *Service) adminConfig() admin.ServiceConfig {
	return admin.ServiceConfig{
		Name:        admin.FanoutService,
		Description: "greendot fanout: makes sure every status revision's events are published",
		InfoSubject: admin.FanoutInfoSubject,
		Config: map[string]any{
			"cache_size": s.cfg.CacheSize,
			"ack_wait":   s.cfg.AckWait.String(),
			"delay":      s.cfg.Delay.String(),
			"replicas":   max(s.cfg.Buckets.Replicas, 1),
			"consumer":   presence.FanoutConsumer,
			"bucket":     presence.StatusBucket,
		},
		Load: func() map[string]any {
			return map[string]any{"cached_users": s.cached.Load()}
		},
		Ready:  s.Ready,
		Logger: s.log,
	}
}
