package gateway

import (
	"sync"
	"time"
)

// workerIdle is how long a worker of workerPool may wait for work before
// it ends.
const workerIdle = 10 * time.Second

// workerPool runs work on goroutines it keeps, at most max at once, each
// with a state of its own (a reader's read buffer), so that work that
// comes often (reading a heartbeat, writing a user's record) neither
// starts a goroutine nor allocates, nor grows a new goroutine's stack
// each time. The worker that became free last is used first, so a quiet
// gateway keeps using the same few; workers with no work for workerIdle
// end (see sweep), and their state with them, and at most keep wait
// free at once: one freed beyond that ends at once.
type workerPool[T, S any] struct {
	do       func(T, S)
	newState func() S
	max      int
	keep     int

	mu      sync.Mutex
	free    sync.Cond       // a worker became free, or the pool stopped
	idle    []*worker[T, S] // free workers, the longest free first
	running int
	stopped bool
	wg      sync.WaitGroup
}

// worker is one goroutine of a workerPool; work hands it what to do.
type worker[T, S any] struct {
	work  chan T // capacity 1: handing work never blocks
	state S
	since time.Time
}

// newWorkerPool returns a pool of at most max workers, each with a state
// newState makes when it starts, that call do, and that keeps every
// worker that becomes free until it has been free for workerIdle.
func newWorkerPool[T, S any](max int, newState func() S, do func(T, S)) *workerPool[T, S] {
	return newWorkerPoolKeeping(max, max, newState, do)
}

// newWorkerPoolKeeping is newWorkerPool keeping at most keep free workers.
func newWorkerPoolKeeping[T, S any](max, keep int, newState func() S, do func(T, S)) *workerPool[T, S] {
	p := &workerPool[T, S]{do: do, newState: newState, max: max, keep: keep}
	p.free.L = &p.mu
	return p
}

// run has a free worker do x, starting one if none is free and fewer than
// max run, or else waiting for one. It reports false, and does nothing,
// once the pool stopped.
func (p *workerPool[T, S]) run(x T) bool {
	p.mu.Lock()
	for len(p.idle) == 0 && p.running >= p.max && !p.stopped {
		p.free.Wait()
	}
	if p.stopped {
		p.mu.Unlock()
		return false
	}
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.work <- x
		return true
	}
	p.running++
	p.mu.Unlock()
	w := &worker[T, S]{work: make(chan T, 1), state: p.newState()}
	p.wg.Go(func() { p.loop(w, x) })
	return true
}

// loop does x, then what the pool hands w, until it is told to end.
func (p *workerPool[T, S]) loop(w *worker[T, S], x T) {
	for {
		p.do(x, w.state)
		p.mu.Lock()
		if p.stopped || len(p.idle) >= p.keep {
			p.running--
			p.free.Signal() // below max now
			p.mu.Unlock()
			return
		}
		w.since = time.Now()
		p.idle = append(p.idle, w)
		p.free.Signal()
		p.mu.Unlock()
		var ok bool
		if x, ok = <-w.work; !ok {
			return
		}
	}
}

// sweep ends the workers free for longer than workerIdle at now.
func (p *workerPool[T, S]) sweep(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].since) >= workerIdle {
		close(p.idle[n].work)
		p.idle[n] = nil
		n++
	}
	p.idle = append(p.idle[:0], p.idle[n:]...)
	p.running -= n
}

// sweepEvery sweeps p every half workerIdle until done is closed.
func sweepEvery[T, S any](done <-chan struct{}, p *workerPool[T, S]) {
	t := time.NewTicker(workerIdle / 2)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			p.sweep(now)
		}
	}
}

// handshakersKept is how many free handshake workers a gateway keeps. A
// handshake's goroutine grows its stack through the upgrade, the
// authentication and the registration (and pages it in): a goroutine
// started per connection did that each time, 11% of a gateway's CPU in a
// connect storm. A storm's handshakes wait on NATS in the hundreds at
// once; those beyond this many end when they are done.
const handshakersKept = 128

// size returns how many workers run, free or not.
func (p *workerPool[T, S]) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running
}

// stop ends every worker once it has done its work, and returns when all
// have. run does nothing after it.
func (p *workerPool[T, S]) stop() {
	p.mu.Lock()
	p.stopped = true
	for _, w := range p.idle {
		close(w.work)
	}
	p.running -= len(p.idle)
	p.idle = nil
	p.free.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}
