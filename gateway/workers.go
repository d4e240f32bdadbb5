package gateway

import (
	"sync"
	"time"
)

// workerIdle is how long a reader of workerPool may wait for work before
// it ends.
const workerIdle = 10 * time.Second

// workerPool runs work (the reads of readable sockets) on goroutines it
// keeps, at most max at once, each with a state of its own (its read
// buffer), so that reading a heartbeat neither starts a goroutine nor
// allocates. The reader that became free last is used first, so a quiet
// gateway keeps using the same few; readers with no work for workerIdle
// end (see sweep), and their state with them.
type workerPool[T, S any] struct {
	do       func(T, S)
	newState func() S
	max      int

	mu      sync.Mutex
	free    sync.Cond       // a reader became free, or the pool stopped
	idle    []*worker[T, S] // free readers, the longest free first
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

// newWorkerPool returns a pool of at most max readers, each with a state
// newState makes when it starts, that call do.
func newWorkerPool[T, S any](max int, newState func() S, do func(T, S)) *workerPool[T, S] {
	p := &workerPool[T, S]{do: do, newState: newState, max: max}
	p.free.L = &p.mu
	return p
}

// run has a free reader do x, starting one if none is free and fewer than
// max run, or else waiting for one. It does nothing once the pool stopped.
func (p *workerPool[T, S]) run(x T) {
	p.mu.Lock()
	for len(p.idle) == 0 && p.running >= p.max && !p.stopped {
		p.free.Wait()
	}
	if p.stopped {
		p.mu.Unlock()
		return
	}
	if n := len(p.idle); n > 0 {
		r := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		r.work <- x
		return
	}
	p.running++
	p.mu.Unlock()
	r := &worker[T, S]{work: make(chan T, 1), state: p.newState()}
	p.wg.Go(func() { p.loop(r, x) })
}

// loop does x, then what the pool hands r, until it is told to end.
func (p *workerPool[T, S]) loop(r *worker[T, S], x T) {
	for {
		p.do(x, r.state)
		p.mu.Lock()
		if p.stopped {
			p.running--
			p.mu.Unlock()
			return
		}
		r.since = time.Now()
		p.idle = append(p.idle, r)
		p.free.Signal()
		p.mu.Unlock()
		var ok bool
		if x, ok = <-r.work; !ok {
			return
		}
	}
}

// sweep ends the readers free for longer than workerIdle at now.
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

// size returns how many readers run, free or not.
func (p *workerPool[T, S]) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running
}

// stop ends every reader once it has done its work, and returns when all
// have. run does nothing after it.
func (p *workerPool[T, S]) stop() {
	p.mu.Lock()
	p.stopped = true
	for _, r := range p.idle {
		close(r.work)
	}
	p.running -= len(p.idle)
	p.idle = nil
	p.free.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}
