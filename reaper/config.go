package reaper

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("reaper: invalid config")

// Config configures a reaper. The zero value is usable: every zero field
// stands for its value in DefaultConfig.
type Config struct {
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// Buckets says how buckets are created if they are missing.
	Buckets presence.BucketOptions
	// Workers is how many users are reconciled at once; zero means 32.
	// Work for one user always goes to the same worker, in order.
	Workers int
	// SweepInterval is how often the full sweep runs after the one at
	// start; zero means never. The ends of leases and a durable consumer
	// that catches up after a restart leave it only what someone changed
	// by hand to repair, and each sweep reads every status record and
	// connection key: NATS traffic proportional to time and to idle
	// connections.
	SweepInterval time.Duration
	// AckWait is how long the end of a lease may stay unacknowledged
	// before it is delivered to another instance (a reaper working on one
	// says it is in progress); zero means 30s.
	AckWait time.Duration
	// RejoinHold is how long, after the reaper's NATS connection came back
	// from being lost, the ends of leases wait before they are applied:
	// gateways that lost NATS with it (a NATS server restarted) register
	// their connections again under new leases first, so an outage longer
	// than the lease TTL does not show their users offline. A gateway that
	// died meanwhile has its users shown offline that much later. Zero
	// means 10s; NoRejoinHold applies them at once.
	RejoinHold time.Duration
}

// NoRejoinHold, as Config.RejoinHold, applies the ends of leases at once
// after a reconnect.
const NoRejoinHold time.Duration = -1

// DefaultConfig returns the configuration every zero field of a Config
// stands for (a nil Logger discards). The command line's flags take their
// defaults from it.
func DefaultConfig() Config {
	return Config{
		Workers:    32,
		AckWait:    30 * time.Second,
		RejoinHold: 10 * time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Workers = cmp.Or(c.Workers, d.Workers)
	c.AckWait = cmp.Or(c.AckWait, d.AckWait)
	c.RejoinHold = max(cmp.Or(c.RejoinHold, d.RejoinHold), 0)
	return c
}

// Validate reports whether c is usable. Every error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.Workers < 0:
		return fmt.Errorf("%w: workers %d", ErrInvalidConfig, c.Workers)
	case c.SweepInterval < 0 || c.SweepInterval > 0 && c.SweepInterval < 100*time.Millisecond:
		return fmt.Errorf("%w: sweep interval %v: want at least 100ms", ErrInvalidConfig, c.SweepInterval)
	case c.AckWait < 0:
		return fmt.Errorf("%w: ack wait %v", ErrInvalidConfig, c.AckWait)
	case c.RejoinHold < 0 && c.RejoinHold != NoRejoinHold:
		return fmt.Errorf("%w: rejoin hold %v", ErrInvalidConfig, c.RejoinHold)
	}
	if err := c.Buckets.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}
