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
	// SweepInterval is how often the full sweep runs; zero means 1m.
	SweepInterval time.Duration
	// AckWait is how long a removal may stay unacknowledged before it is
	// delivered to another instance; zero means 30s.
	AckWait time.Duration
	// Now returns the current time; nil means time.Now. Tests may replace it.
	Now func() time.Time
}

// DefaultConfig returns the configuration every zero field of a Config
// stands for (a nil Logger discards, a nil Now is time.Now). The command
// line's flags take their defaults from it.
func DefaultConfig() Config {
	return Config{
		Workers:       32,
		SweepInterval: time.Minute,
		AckWait:       30 * time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Workers = cmp.Or(c.Workers, d.Workers)
	c.SweepInterval = cmp.Or(c.SweepInterval, d.SweepInterval)
	c.AckWait = cmp.Or(c.AckWait, d.AckWait)
	if c.Now == nil {
		c.Now = time.Now
	}
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
	}
	if err := c.Buckets.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}
