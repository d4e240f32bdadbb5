package client

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Backoff is how long a Client waits between reconnect attempts:
// exponential with full jitter. Before attempt n (0 for the first retry) it
// waits a uniformly random time from 0 up to min(Max, Base·2ⁿ), so that
// many clients cut off at once do not come back at once, and none waits
// more than Max.
type Backoff struct {
	// Base is the bound of the first wait; zero means 500ms.
	Base time.Duration
	// Max bounds every wait; zero means 30s. It must be at least Base.
	Max time.Duration
}

// Default backoff bounds.
const (
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
)

// withDefaults fills the zero fields of b and checks it.
func (b Backoff) withDefaults() (Backoff, error) {
	if b.Base == 0 {
		b.Base = DefaultBackoffBase
	}
	if b.Max == 0 {
		b.Max = max(DefaultBackoffMax, b.Base)
	}
	switch {
	case b.Base < 0:
		return b, fmt.Errorf("backoff base %v is negative", b.Base)
	case b.Max < b.Base:
		return b, fmt.Errorf("backoff max %v is less than base %v", b.Max, b.Base)
	}
	return b, nil
}

// Cap returns the bound of the wait before attempt n: min(Max, Base·2ⁿ).
// Zero fields count as their defaults.
func (b Backoff) Cap(attempt int) time.Duration {
	if b.Base <= 0 {
		b.Base = DefaultBackoffBase
	}
	if b.Max <= 0 {
		b.Max = max(DefaultBackoffMax, b.Base)
	}
	c := b.Base
	for range max(attempt, 0) {
		if c >= b.Max/2 {
			return b.Max
		}
		c *= 2
	}
	return min(c, b.Max)
}

// Delay returns a random wait before attempt n, from 0 up to Cap(n).
func (b Backoff) Delay(attempt int) time.Duration {
	return b.delay(attempt, rand.Float64())
}

// delay is Delay with the random number r, in [0, 1), given.
func (b Backoff) delay(attempt int, r float64) time.Duration {
	return time.Duration(r * float64(b.Cap(attempt)))
}
