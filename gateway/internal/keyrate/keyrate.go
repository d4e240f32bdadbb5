// Package keyrate limits how fast each of many keys (an identity, a source
// address) may make requests: a token bucket per key, kept only while the
// key is using it.
package keyrate

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// sweepEvery is how many new keys a Limiter takes between sweeps of the
// keys whose buckets are full again.
const sweepEvery = 1024

// Limiter is a token bucket per key. It is safe for concurrent use.
type Limiter struct {
	limit rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	added   int // keys added since the last sweep
}

// New returns a Limiter that lets each key make perSecond requests on
// average and burst at once.
func New(perSecond float64, burst int) *Limiter {
	return &Limiter{limit: rate.Limit(perSecond), burst: burst, buckets: make(map[string]*rate.Limiter)}
}

// Allow takes a token from key's bucket at now. When there is none it
// returns false and how long until there will be one.
func (l *Limiter) Allow(key string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if l.added++; l.added >= sweepEvery {
			l.sweepLocked(now)
		}
		b = rate.NewLimiter(l.limit, l.burst)
		l.buckets[key] = b
	}
	if b.AllowN(now, 1) {
		return true, 0
	}
	// One token is 1/limit seconds of refill; what is missing of it is
	// how long to wait.
	missing := 1 - b.TokensAt(now)
	return false, time.Duration(math.Ceil(missing / float64(l.limit) * float64(time.Second)))
}

// Len returns how many keys have a bucket.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// sweepLocked forgets the keys whose buckets are full again at now: a new
// bucket for them would be the same. The caller holds mu.
func (l *Limiter) sweepLocked(now time.Time) {
	l.added = 0
	for k, b := range l.buckets {
		if b.TokensAt(now) >= float64(l.burst) {
			delete(l.buckets, k)
		}
	}
}
