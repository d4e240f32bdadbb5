package socket

import (
	"sync"
	"time"
)

// Linger runs the lingering part of closing connections (Conn.Close) in the
// background, a bounded number at once, each bounded in time and in the
// bytes it reads, so that a hostile peer cannot hold a closing connection
// open. It is safe for concurrent use.
type Linger struct {
	timeout time.Duration
	budget  int
	maxMsg  int
	sem     chan struct{}

	mu      sync.Mutex
	stopped bool
	wg      sync.WaitGroup
}

// NewLinger returns a Linger that lingers on at most max connections at
// once, each for at most timeout and budget bytes read, decoding what it
// reads with messages of at most maxMsg bytes (to find the peer's close
// frame).
func NewLinger(max int, timeout time.Duration, budget, maxMsg int) *Linger {
	return &Linger{timeout: timeout, budget: budget, maxMsg: maxMsg, sem: make(chan struct{}, max)}
}

// start runs fn in a goroutine if a place is free and l is not stopped,
// and reports whether it did.
func (l *Linger) start(fn func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	select {
	case l.sem <- struct{}{}:
	default:
		return false
	}
	l.wg.Go(func() {
		defer func() { <-l.sem }()
		fn()
	})
	return true
}

// Stop makes every later close quick, and waits until the closes that
// linger have ended.
func (l *Linger) Stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	l.wg.Wait()
}
