package gateway

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// The memory trim: a gateway that holds many idle connections allocates
// next to nothing (reading a heartbeat allocates nothing), yet its process
// keeps the memory its heap grew to while the connections came, up to
// twice what they hold (the collector's target at GOGC=100) and the
// garbage the connecting left. When the process has allocated little
// since the last look and holds enough free or collectable heap, the
// gateway collects and gives the free memory back to the operating system
// (debug.FreeOSMemory). While the gateway is busy it does nothing: its
// heap grows and shrinks as Go's collector decides.

// The runtime's figures the trim reads.
const (
	metricAllocs  = "/gc/heap/allocs:bytes"
	metricLive    = "/gc/heap/live:bytes"
	metricFree    = "/memory/classes/heap/free:bytes"
	metricUnused  = "/memory/classes/heap/unused:bytes"
	metricObjects = "/memory/classes/heap/objects:bytes"
)

// heapFigures are the runtime's figures, in bytes.
type heapFigures struct {
	allocs  uint64 // allocated since the process started
	live    uint64 // reachable at the end of the last collection
	free    uint64 // free and not given back: resident, and returnable
	unused  uint64 // in spans in use but not holding objects: gaps
	objects uint64 // in objects, live or garbage not yet swept
}

// spare is what a collection and giving back could take from the process:
// the free heap, the gaps, and the objects beyond the last live heap.
func (h heapFigures) spare() uint64 {
	return h.free + h.unused + h.objects - min(h.objects, h.live)
}

// worthTrimming reports whether the process, having allocated allocated
// bytes since the last look, is quiet (at most 1/32 of its live heap plus
// 256 KiB) and holds enough to give back (a spare of at least 4 MiB and of
// an eighth of the live heap).
func worthTrimming(allocated uint64, h heapFigures) bool {
	quiet := allocated <= h.live/32+256<<10
	spare := h.spare()
	return quiet && spare >= 4<<20 && spare >= h.live/8
}

// memoryTrim looks every interval, until ctx ends, whether to give memory
// back.
func (s *Service) memoryTrim(ctx context.Context, interval time.Duration) {
	samples := []metrics.Sample{{Name: metricAllocs}, {Name: metricLive}, {Name: metricFree}, {Name: metricUnused}, {Name: metricObjects}}
	read := func() heapFigures {
		metrics.Read(samples)
		var h heapFigures
		for i, p := range []*uint64{&h.allocs, &h.live, &h.free, &h.unused, &h.objects} {
			if samples[i].Value.Kind() == metrics.KindUint64 {
				*p = samples[i].Value.Uint64()
			}
		}
		return h
	}
	last := read().allocs
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h := read()
		if worthTrimming(h.allocs-last, h) {
			debug.FreeOSMemory()
			after := read()
			s.metrics.memoryTrims.Inc()
			s.log.Debug("memory given back", "spare_before", h.spare(), "spare_after", after.spare(), "live", after.live)
			h = after
		}
		last = h.allocs
	}
}
