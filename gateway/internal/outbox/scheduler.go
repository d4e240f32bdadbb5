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
// itself. Two rules decide when, the changes of a socket coalescing in its
// Box while it waits:
//
//   - A socket is written at most once per batch interval.
//   - Over time, a socket is written at most once per pace on average,
//     with a burst: one whose changes come no faster than that is written
//     each time at once (up to PaceBurst times in a row, a batch interval
//     apart), and one that gets changes faster is written once per pace.
//     That is the generic cell rate algorithm: Box.Take moves the socket's
//     paced time, and the socket may be written once its paced time, less
//     PaceBurst-1 paces, has come.
//
// With the pace equal to the batch interval the second rule changes
// nothing. Schedule is safe for concurrent use; Run runs the scheduler.
type Scheduler struct {
	interval  int64 // ns
	pace      int64 // ns
	tolerance int64 // ns: PaceBurst-1 paces
	retry     time.Duration
	workers   int

	mu     sync.Mutex
	ready  []Flusher // to write now
	spare  []Flusher
	timers timerHeap // to write later
	signal chan struct{}
	queued atomic.Int64
}

// PaceBurst is how many writes in a row a socket that was quiet may have
// a batch interval apart before its pace applies.
const PaceBurst = 5

// NewScheduler returns a scheduler that writes each socket at most once
// per interval, and once per pace on average (at least interval), on
// workers goroutines. It starts nothing: Run does.
func NewScheduler(interval, pace time.Duration, workers int) *Scheduler {
	pace = max(pace, interval)
	return &Scheduler{
		interval:  int64(interval),
		pace:      int64(pace),
		tolerance: (PaceBurst - 1) * int64(pace),
		retry:     min(max(interval/10, time.Millisecond), 5*time.Millisecond),
		workers:   max(workers, 1),
		signal:    make(chan struct{}, 1),
	}
}

// Pace returns the pace in ns, which Box.Take counts writes by.
func (s *Scheduler) Pace() int64 { return s.pace }

// Schedule has f written once: at once when both rules allow (paced and
// written are its Box's Paced), else as soon as they do. The caller
// schedules a socket only when its Box says to (Box.Add, Box.AddSelf,
// Box.AddRooms, Box.Release), so it is never queued twice.
func (s *Scheduler) Schedule(f Flusher, paced, written int64) {
	s.queued.Add(1)
	// A socket never written (zeros) is due at once under both rules.
	due := max(paced-s.tolerance, written+s.interval)
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
