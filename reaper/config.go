package reaper

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("reaper: invalid config")

// Config configures a reaper. The zero value is usable.
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

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Workers == 0 {
		c.Workers = 32
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports whether c is usable.
func (c Config) Validate() error {
	switch {
	case c.Workers < 0:
		return fmt.Errorf("%w: workers %d", ErrInvalidConfig, c.Workers)
	case c.SweepInterval < 0 || c.SweepInterval > 0 && c.SweepInterval < 100*time.Millisecond:
		return fmt.Errorf("%w: sweep interval %v: want at least 100ms", ErrInvalidConfig, c.SweepInterval)
	case c.AckWait < 0:
		return fmt.Errorf("%w: ack wait %v", ErrInvalidConfig, c.AckWait)
	}
	return c.Buckets.Validate()
}
