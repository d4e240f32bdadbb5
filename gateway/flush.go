package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/greendot/greendot/pkg/protocol"
)

// flusher writes what is pending for sockets, once per batch interval: at
// most one presence_batch frame per socket per interval, holding at most one
// entry per watched user (the newest). Writes are spread over a bounded
// number of workers, so one slow socket delays only itself; a socket still
// busy with its previous write is retried on the next tick, its changes
// coalescing meanwhile.
type flusher struct {
	s     *Service
	mu    sync.Mutex
	dirty []*conn
	spare []*conn
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

// run flushes every interval until ctx is canceled.
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
	t := time.NewTicker(f.s.cfg.BatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.mu.Lock()
		batch := f.dirty
		f.dirty, f.spare = f.spare[:0], nil
		f.mu.Unlock()
		for i, c := range batch {
			select {
			case work <- c:
			case <-ctx.Done():
				return
			}
			batch[i] = nil
		}
		f.mu.Lock()
		f.spare = batch[:0]
		f.mu.Unlock()
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
