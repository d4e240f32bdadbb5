package bench

import (
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"
)

// The speed probe tells when the machine's processors ran slow while a
// phase was measured. Every probeEvery it does probeWork, a fixed amount
// of arithmetic, on a thread of its own, and reads how much of that
// thread's CPU time it took. Time the thread spent waiting for a core is
// not counted, so a machine that is merely busy does not read as slow; a
// virtual machine whose host gives its cores' time elsewhere, or slows
// them, does. A probe that took more than slowFactor times the phase's
// median ran slow; slow probes up to slowJoin apart make one slow
// span.
const (
	probeEvery = 10 * time.Millisecond
	probeWork  = 10_000
	slowFactor = 2
	slowJoin   = 3 * probeEvery
	// settleAfter is how long after a slow span a delivery still counts
	// as touched by it: what queued while the machine was slow takes
	// that long to drain.
	settleAfter = 50 * time.Millisecond
	// probeCap bounds the samples one probe keeps: over an hour of them.
	probeCap = 400_000
)

// probeSample is one probe: when it started (unix ns) and the CPU time it
// took (ns).
type probeSample struct {
	at, cost int64
}

// speedProbe samples the machine's speed until finish. Its methods are safe
// for concurrent use.
type speedProbe struct {
	mu      sync.Mutex
	samples []probeSample
	stop    chan struct{}
	done    chan struct{}
}

// startProbe starts a probe, or returns nil where a thread's CPU time
// cannot be read.
func startProbe() *speedProbe {
	if _, ok := threadCPU(); !ok {
		return nil
	}
	p := &speedProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *speedProbe) run() {
	defer close(p.done)
	// The thread's CPU time is the probe's own only while no other
	// goroutine runs on it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	x := uint64(1)
	for {
		at := time.Now().UnixNano()
		c0, _ := threadCPU()
		x = spin(x)
		c1, _ := threadCPU()
		p.mu.Lock()
		if len(p.samples) < probeCap {
			p.samples = append(p.samples, probeSample{at: at, cost: c1 - c0})
		}
		p.mu.Unlock()
		select {
		case <-p.stop:
			// The work's result must be needed, or the compiler may
			// drop it.
			runtime.KeepAlive(x)
			return
		case <-t.C:
		}
	}
}

// spin does probeWork steps of a linear congruential generator: work for
// the processor alone, with nothing to wait for.
func spin(x uint64) uint64 {
	for range probeWork {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

// finish stops the probe and returns the machine's slow spans since it
// started. A nil probe found none.
func (p *speedProbe) finish() slowSpans {
	if p == nil {
		return slowSpans{}
	}
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return findSlow(p.samples)
}

// slowSpans are the spans of a phase in which the machine ran slow.
type slowSpans struct {
	// spans are [start, end] in unix ns, in order and apart.
	spans [][2]int64
	// probes counts the samples, slow those that ran slow.
	probes, slow int
	// median is the median probe's CPU time (ns).
	median int64
	// from and to are the first probe's start and the last one's end.
	from, to int64
}

// findSlow finds the slow spans among samples, which are in the order
// taken.
func findSlow(samples []probeSample) slowSpans {
	s := slowSpans{probes: len(samples)}
	if len(samples) == 0 {
		return s
	}
	costs := make([]int64, len(samples))
	for i, p := range samples {
		costs[i] = p.cost
	}
	slices.Sort(costs)
	s.median = costs[len(costs)/2]
	s.from = samples[0].at
	last := samples[len(samples)-1]
	s.to = last.at + last.cost
	for _, p := range samples {
		if p.cost <= slowFactor*s.median {
			continue
		}
		s.slow++
		end := p.at + p.cost
		if n := len(s.spans); n > 0 && p.at-s.spans[n-1][1] <= int64(slowJoin) {
			s.spans[n-1][1] = max(s.spans[n-1][1], end)
			continue
		}
		s.spans = append(s.spans, [2]int64{p.at, end})
	}
	return s
}

// slowTime returns how long the spans last in all.
func (s slowSpans) slowTime() time.Duration {
	var d int64
	for _, sp := range s.spans {
		d += sp[1] - sp[0]
	}
	return time.Duration(d)
}

// touches reports whether something that ran from start to end (unix ns)
// overlapped a slow span, or began within settleAfter after one ended.
func (s slowSpans) touches(start, end int64) bool {
	// The spans starting after end cannot touch it; of those before, the
	// last ones end latest.
	i := sort.Search(len(s.spans), func(i int) bool { return s.spans[i][0] > end })
	return i > 0 && s.spans[i-1][1]+int64(settleAfter) >= start
}

// watchSpeed starts the speed probe and the log of what the workers see
// for a measured phase. Its end stops both, and adds to counts and hists
// what the orchestrator reports of them (addSlow): the probe's findings,
// and the "latency_clear" histogram of the deliveries clear of the slow
// spans.
func (w *worker) watchSpeed() (end func(counts map[string]int64, hists map[string]*hist)) {
	seen := &deliveryLog{}
	w.delivered.Store(seen)
	probe := startProbe()
	return func(counts map[string]int64, hists map[string]*hist) {
		w.delivered.Store(nil)
		slow := probe.finish()
		counts["probe_median_ns"] = slow.median
		counts["probed_ns"] = slow.to - slow.from
		counts["slow_ns"] = int64(slow.slowTime())
		counts["slow_spans"] = int64(len(slow.spans))
		counts["deliveries_unlogged"] = seen.dropped
		hists["latency_clear"] = seen.steady(slow)
	}
}

// deliveryLog keeps when each delivery of a phase was sent and seen, so
// that it can be told apart by the slow spans once the phase is over. It
// is safe for concurrent use.
type deliveryLog struct {
	mu sync.Mutex
	// v holds sent and seen times (unix ns) in pairs.
	v []int64
	// dropped counts deliveries past logCap.
	dropped int64
}

// logCap bounds the deliveries one log keeps (32 MB).
const logCap = 2_000_000

func (l *deliveryLog) add(sent, seen int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.v) >= 2*logCap {
		l.dropped++
		return
	}
	l.v = append(l.v, sent, seen)
}

// steady returns a histogram of the deliveries that no slow span touched.
func (l *deliveryLog) steady(s slowSpans) *hist {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := newHist()
	for i := 0; i+1 < len(l.v); i += 2 {
		sent, seen := l.v[i], l.v[i+1]
		if !s.touches(sent, seen) {
			h.record(time.Duration(seen - sent))
		}
	}
	return h
}
