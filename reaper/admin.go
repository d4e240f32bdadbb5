package reaper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/presence"
)

// ErrNotReady means the reaper has not opened its buckets or finished its
// sweep at start yet, or is stopping. Ready wraps it with what the reaper
// waits for: "reaper: not ready: start-up sweep under way (12345 records
// read)".
var ErrNotReady = errors.New("reaper: not ready")

// Ready reports whether the reaper runs: its buckets are open, its sweep
// at start has finished, and its NATS connection is up; if not, its error
// says what it waits for (see durable.Consumer.Ready). It is safe for
// concurrent use; --metrics-listen serves it on GET /readyz.
func (s *Service) Ready(ctx context.Context) error {
	return s.consumer.Ready(ctx)
}

// adminConfig describes the reaper's micro service, greendot-reaper: its
// info (broadcast) and sweep (one reaper) endpoints.
func (s *Service) adminConfig() admin.ServiceConfig {
	return admin.ServiceConfig{
		Name:        admin.ReaperService,
		Description: "greendot reaper: the ends of gateway leases to offline",
		InfoSubject: admin.ReaperInfoSubject,
		Config: map[string]any{
			"workers":        s.cfg.Workers,
			"sweep_interval": s.cfg.SweepInterval.String(),
			"ack_wait":       s.cfg.AckWait.String(),
			"replicas":       max(s.cfg.Buckets.Replicas, 1),
			"consumer":       presence.ReaperConsumer,
			"bucket":         presence.LeasesBucket,
		},
		Load: func() map[string]any {
			return map[string]any{
				"queued_tasks": s.queued(),
			}
		},
		Ready:  s.Ready,
		Logger: s.log,
		Endpoints: []admin.Endpoint{{
			Name:    admin.SweepEndpoint,
			Subject: admin.ReaperSweepSubject,
			Timeout: 5 * time.Minute,
			Handle:  s.sweepRequest,
		}},
	}
}

// sweepRequest runs a sweep now and reports what it removed. The request's
// payload is ignored. A sweep fails only when it cannot read or write the
// buckets: the reaper is then unavailable.
func (s *Service) sweepRequest(ctx context.Context, _ []byte) (any, error) {
	start := time.Now()
	removed, err := s.runSweep(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: sweep: %v", admin.ErrUnavailable, err)
	}
	return admin.SweepReply{Instance: admin.InstanceOf(ctx), Removed: removed, Duration: time.Since(start)}, nil
}

// runSweep runs one sweep, after any that runs, and records it.
func (s *Service) runSweep(ctx context.Context) (int, error) {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	start := time.Now()
	removed, err := s.sweep(ctx)
	s.metrics.swept(start, err)
	return removed, err
}
