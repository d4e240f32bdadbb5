package reaper

import (
	"container/heap"
	"sync"
	"time"
)

// timers holds one inactivity deadline per connection key and tells when
// the earliest is due. It keeps at most one heap entry per key: a deadline
// that moves later is found when its old entry pops, and pushed again.
// It is safe for concurrent use.
type timers struct {
	mu    sync.Mutex
	items map[string]*timerItem
	heap  timerHeap
	wake  chan struct{} // signalled when an earlier deadline arrives
}

type timerItem struct {
	key    string
	due    int64 // the current deadline, unix ms
	queued int64 // the deadline of this key's heap entry; 0 if none
}

type timerEntry struct {
	due int64
	key string
}

type timerHeap []timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newTimers() *timers {
	return &timers{items: make(map[string]*timerItem), wake: make(chan struct{}, 1)}
}

// set makes due (unix ms) the deadline of key.
func (t *timers) set(key string, due int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	it := t.items[key]
	if it == nil {
		it = &timerItem{key: key}
		t.items[key] = it
	}
	it.due = due
	if it.queued != 0 && it.queued <= due {
		return // the queued entry pops first and is pushed again if needed
	}
	it.queued = due
	heap.Push(&t.heap, timerEntry{due: due, key: key})
	if t.heap[0].key == key && t.heap[0].due == due {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// clear forgets key's deadline.
func (t *timers) clear(key string) {
	t.mu.Lock()
	delete(t.items, key)
	t.mu.Unlock()
}

// len returns how many keys have a deadline.
func (t *timers) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.items)
}

// due removes and returns the keys whose deadline is at or before now, and
// the time until the next deadline (or -1 if there is none).
func (t *timers) due(now time.Time) (keys []string, next time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ms := now.UnixMilli()
	for len(t.heap) > 0 && t.heap[0].due <= ms {
		e := heap.Pop(&t.heap).(timerEntry)
		it := t.items[e.key]
		if it == nil || it.queued != e.due {
			continue // cleared, or a stale duplicate
		}
		if it.due > e.due {
			it.queued = it.due
			heap.Push(&t.heap, timerEntry{due: it.due, key: e.key})
			continue
		}
		delete(t.items, e.key)
		keys = append(keys, e.key)
	}
	if len(t.heap) == 0 {
		return keys, -1
	}
	return keys, time.Duration(t.heap[0].due-ms) * time.Millisecond
}
