package outbox

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Flusher is a socket a Scheduler writes to.
type Flusher interface {
	// Flush writes what waits for the socket (Box.Take, then the frames),
	// using buf as scratch, and returns buf. It reports false when the
	// socket was busy with another write and nothing was taken: the
	// scheduler tries again shortly.
	Flush(buf []byte) ([]byte, bool)
}

// Scheduler decides when sockets with changes are written, and writes
// them on a bounded number of workers, so one slow socket delays only
// itself. A socket last written at least a batch interval ago is written
// at once; one written more recently is written a batch interval after
// that write, its changes coalescing meanwhile in its Box. Schedule is
// safe for concurrent use; Run runs the scheduler.
type Scheduler struct {
	interval int64 // ns
	retry    time.Duration
	workers  int

	mu     sync.Mutex
	ready  []Flusher // to write now
	spare  []Flusher
	timers timerHeap // to write later
	signal chan struct{}
	queued atomic.Int64
}

// NewScheduler returns a scheduler that writes each socket at most once
// per interval, on workers goroutines. It starts nothing: Run does.
func NewScheduler(interval time.Duration, workers int) *Scheduler {
	return &Scheduler{
		interval: int64(interval),
		retry:    min(max(interval/10, time.Millisecond), 5*time.Millisecond),
		workers:  max(workers, 1),
		signal:   make(chan struct{}, 1),
	}
}

// Schedule has f written once: at once when flushedAt (unix ns, the last
// time its socket was written changes) is at least an interval ago, else
// an interval after it. The caller schedules a socket only when its Box
// says to (Box.Add, Box.AddSelf, Box.Release), so it is never queued
// twice.
func (s *Scheduler) Schedule(f Flusher, flushedAt int64) {
	s.queued.Add(1)
	due := flushedAt + s.interval
	s.mu.Lock()
	if due <= time.Now().UnixNano() {
		s.ready = append(s.ready, f)
	} else {
		heap.Push(&s.timers, timer{due: due, f: f})
		if s.timers[0].f != f {
			s.mu.Unlock()
			return // an earlier timer already wakes the loop in time
		}
	}
	s.mu.Unlock()
	s.wake()
}

// later has f written at due (unix ns).
func (s *Scheduler) later(f Flusher, due int64) {
	s.mu.Lock()
	heap.Push(&s.timers, timer{due: due, f: f})
	first := s.timers[0].f == f
	s.mu.Unlock()
	if first {
		s.wake()
	}
}

func (s *Scheduler) wake() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// Pending returns how many sockets wait to be written.
func (s *Scheduler) Pending() int { return int(s.queued.Load()) }

// Run writes scheduled sockets until ctx is canceled, and returns when its
// workers have finished the writes they were doing.
func (s *Scheduler) Run(ctx context.Context) {
	work := make(chan Flusher)
	var wg sync.WaitGroup
	for range s.workers {
		wg.Go(func() {
			buf := make([]byte, 0, 4096)
			for f := range work {
				var ok bool
				if buf, ok = f.Flush(buf[:0]); !ok {
					s.later(f, time.Now().Add(s.retry).UnixNano())
					continue
				}
				s.queued.Add(-1)
			}
		})
	}
	defer func() {
		close(work)
		wg.Wait()
	}()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		now := time.Now().UnixNano()
		for len(s.timers) > 0 && s.timers[0].due <= now {
			s.ready = append(s.ready, heap.Pop(&s.timers).(timer).f)
		}
		batch := s.ready
		s.ready, s.spare = s.spare[:0], nil
		wait := time.Duration(-1)
		if len(s.timers) > 0 {
			wait = time.Duration(s.timers[0].due - now)
		}
		s.mu.Unlock()

		for i, f := range batch {
			batch[i] = nil
			select {
			case work <- f:
			case <-ctx.Done():
				return
			}
		}
		s.mu.Lock()
		if s.spare == nil {
			s.spare = batch[:0]
		}
		more := len(s.ready) > 0
		s.mu.Unlock()
		if more {
			continue
		}
		if wait < 0 {
			wait = time.Hour
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-s.signal:
		case <-t.C:
		}
	}
}

// timer is a socket to write at due (unix ns).
type timer struct {
	due int64
	f   Flusher
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = timer{}
	*h = old[:len(old)-1]
	return e
}
