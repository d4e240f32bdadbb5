package fanout

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// Config configures a fanout. The zero value is usable: every zero field
// stands for its value in DefaultConfig.
type Config struct {
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// Buckets says how buckets are created if they are missing.
	Buckets presence.BucketOptions
	// CacheSize bounds how many users' last published versions are
	// remembered to suppress duplicates; zero means 1,000,000. When full the
	// memory is cleared, which costs at most one duplicate event per user.
	CacheSize int
	// AckWait is how long a revision may stay unacknowledged before it is
	// delivered to another instance; zero means 10s. At least Delay.
	AckWait time.Duration
	// Delay is how long after a status revision was written the fanout
	// waits for its writer's events before it publishes them itself; zero
	// means 250ms. The writer publishes them as soon as its write is
	// acknowledged, so the fanout publishes only what a writer that died
	// in between, or lost its connection, could not.
	Delay time.Duration
}

// DefaultConfig returns the configuration every zero field of a Config
// stands for (a nil Logger discards). The command line's flags take their
// defaults from it.
func DefaultConfig() Config {
	return Config{
		CacheSize: 1_000_000,
		AckWait:   10 * time.Second,
		Delay:     250 * time.Millisecond,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.CacheSize = cmp.Or(c.CacheSize, d.CacheSize)
	c.AckWait = cmp.Or(c.AckWait, d.AckWait)
	c.Delay = cmp.Or(c.Delay, d.Delay)
	return c
}

// Validate reports whether c is usable. Every error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	if c.CacheSize < 0 {
		return fmt.Errorf("%w: cache size %d", ErrInvalidConfig, c.CacheSize)
	}
	if c.AckWait < 0 {
		return fmt.Errorf("%w: ack wait %v", ErrInvalidConfig, c.AckWait)
	}
	if c.Delay < 0 || c.Delay > time.Minute {
		return fmt.Errorf("%w: delay %v: want 0 to 1m", ErrInvalidConfig, c.Delay)
	}
	if d := cmp.Or(c.Delay, DefaultConfig().Delay); c.AckWait > 0 && c.AckWait <= d {
		return fmt.Errorf("%w: ack wait %v: want more than the delay %v", ErrInvalidConfig, c.AckWait, d)
	}
	if err := c.Buckets.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("fanout: invalid config")
