package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/greendot/greendot/pkg/protocol"
)

// flusher writes what is pending for sockets: at most one presence_batch
// frame per socket per batch interval, holding at most one entry per
// watched user (the newest). A socket not written to for a batch interval
// gets a change at the next tick (a tenth of the interval, 1 to 5 ms); one
// written to more recently waits for the rest of its interval, its changes
// coalescing meanwhile. So a change to a quiet socket is not held for a
// whole interval, and a busy socket is still written once per interval.
// Writes are spread over a bounded number of workers, so one slow socket
// delays only itself; a socket still busy with its previous write is
// retried on the next tick.
type flusher struct {
	s     *Service
	mu    sync.Mutex
	dirty []*conn
	spare []*conn
	// held are the sockets of a tick still within their interval; only
	// run uses it.
	held []*conn
}

// tick is how often the flusher looks at the sockets with changes.
func (f *flusher) tick() time.Duration {
	return min(max(f.s.cfg.BatchInterval/10, time.Millisecond), 5*time.Millisecond)
}

// add puts c in the next batch. The caller has set c.queued.
func (f *flusher) add(c *conn) {
	f.mu.Lock()
	f.dirty = append(f.dirty, c)
	f.mu.Unlock()
}

// pending returns how many sockets wait for the next batch.
func (f *flusher) pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.dirty)
}

// run flushes every tick until ctx is canceled.
func (f *flusher) run(ctx context.Context) {
	work := make(chan *conn)
	var wg sync.WaitGroup
	for range f.s.cfg.WriteWorkers {
		wg.Go(func() {
			buf := make([]byte, 0, 4096)
			for c := range work {
				buf = c.flush(buf[:0])
			}
		})
	}
	defer func() {
		close(work)
		wg.Wait()
	}()
	interval := int64(f.s.cfg.BatchInterval)
	t := time.NewTicker(f.tick())
	defer t.Stop()
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case now = <-t.C:
		}
		f.mu.Lock()
		batch := f.dirty
		f.dirty, f.spare = f.spare[:0], nil
		f.mu.Unlock()
		for i, c := range batch {
			batch[i] = nil
			if now.UnixNano()-c.flushedAt.Load() < interval {
				f.held = append(f.held, c) // still queued
				continue
			}
			select {
			case work <- c:
			case <-ctx.Done():
				return
			}
		}
		f.mu.Lock()
		f.spare = batch[:0]
		f.dirty = append(f.dirty, f.held...)
		f.mu.Unlock()
		clear(f.held)
		f.held = f.held[:0]
	}
}

// flush writes c's pending changes, using buf as scratch, and returns buf.
func (c *conn) flush(buf []byte) []byte {
	if c.closed.Load() {
		return buf
	}
	if !c.wmu.TryLock() {
		// Busy with a reply or a slow write: try again next tick.
		c.s.flusher.add(c)
		return buf
	}
	defer c.wmu.Unlock()
	c.pmu.Lock()
	updates, self, oldest := c.pending, c.self, c.oldest
	c.pending, c.oldest = nil, 0
	c.self.pending = false
	c.queued = false
	c.pmu.Unlock()

	s := c.s
	if self.pending || len(updates) > 0 {
		c.flushedAt.Store(time.Now().UnixNano())
	}
	if self.pending {
		buf = protocol.AppendSelf(buf[:0], self.status, self.devices)
		if c.writeTextLocked(buf) != nil {
			return buf
		}
		s.metrics.msgsOut.WithLabelValues(protocol.TypeSelf).Inc()
	}
	if len(updates) > 0 {
		buf = protocol.AppendBatch(buf[:0], updates)
		if c.writeTextLocked(buf) != nil {
			return buf
		}
		s.metrics.msgsOut.WithLabelValues(protocol.TypePresenceBatch).Inc()
		if oldest != 0 {
			s.metrics.propagation.Observe(time.Since(time.UnixMilli(oldest)).Seconds())
		}
	}
	return buf
}
