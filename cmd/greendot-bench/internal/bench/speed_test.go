package bench

import (
	"runtime"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// steady returns n probes from at, probeEvery apart, each costing cost.
func steady(at int64, n int, cost int64) []probeSample {
	s := make([]probeSample, n)
	for i := range s {
		s[i] = probeSample{at: at + int64(i)*int64(probeEvery), cost: cost}
	}
	return s
}

func TestFindSlow(t *testing.T) {
	samples := steady(0, 100, 20_000)
	// Two probes in a row at three times the cost make one span; one
	// further on, far from them, another; one at exactly twice the cost
	// is not slow.
	samples[10].cost, samples[11].cost = 60_000, 60_000
	samples[50].cost = 90_000
	samples[70].cost = 40_000
	s := findSlow(samples)
	if s.probes != 100 || s.slow != 3 || s.median != 20_000 {
		t.Fatalf("probes %d slow %d median %d, want 100, 3, 20000", s.probes, s.slow, s.median)
	}
	want := [][2]int64{{100 * ms, 110*ms + 60_000}, {500 * ms, 500*ms + 90_000}}
	if len(s.spans) != len(want) || s.spans[0] != want[0] || s.spans[1] != want[1] {
		t.Fatalf("spans %v, want %v", s.spans, want)
	}
	if got := s.slowTime(); got != time.Duration(10*ms+60_000+90_000) {
		t.Errorf("slow time %v", got)
	}
	if s.from != 0 || s.to != 990*ms+20_000 {
		t.Errorf("probed from %d to %d", s.from, s.to)
	}

	// Slow probes up to slowJoin apart join; further apart they do not.
	samples = steady(0, 100, 20_000)
	samples[10].cost, samples[13].cost, samples[17].cost = 60_000, 60_000, 60_000
	s = findSlow(samples)
	if len(s.spans) != 2 || s.spans[0] != [2]int64{100 * ms, 130*ms + 60_000} {
		t.Fatalf("spans %v: want the probes 3 apart joined and the one 4 further apart not", s.spans)
	}

	if s := findSlow(nil); s.probes != 0 || len(s.spans) != 0 || s.slowTime() != 0 {
		t.Errorf("no samples: %+v", s)
	}
}

func TestTouches(t *testing.T) {
	s := slowSpans{spans: [][2]int64{{100 * ms, 200 * ms}, {1000 * ms, 1100 * ms}}}
	settle := int64(settleAfter)
	for _, tt := range []struct {
		start, end int64
		want       bool
	}{
		{0, 99 * ms, false},                              // before the first
		{0, 100 * ms, true},                              // reaches it
		{150 * ms, 151 * ms, true},                       // inside
		{90 * ms, 1200 * ms, true},                       // across both
		{200*ms + settle, 300 * ms, true},                // begins as it has just drained
		{200*ms + settle + 1, 300 * ms, false},           // begins after that
		{500 * ms, 999 * ms, false},                      // between them
		{1100*ms + settle + 1, 2000 * ms, false},         // after the last
		{1100*ms + settle - 1, 1100*ms + settle, true},   // just in the last one's wake
		{200*ms + settle + 1, 1000 * ms, true},           // reaches the second
		{200*ms + settle + 1, 1000*ms - 1, false},        // stops short of it
		{1050 * ms, 1050 * ms, true},                     // an instant inside
		{-5 * ms, -1 * ms, false},                        // long before
		{1100*ms + 2*settle, 1100*ms + 3*settle, false},  // long after
		{100*ms - 1, 100*ms - 1, false},                  // an instant before
		{200 * ms, 200 * ms, true},                       // an instant at the end
		{1000*ms - settle, 1000*ms - settle + 1, false},  // settling applies after a span, not before
		{200*ms + settle/2, 200*ms + settle/2 + 1, true}, // in the wake
	} {
		if got := s.touches(tt.start, tt.end); got != tt.want {
			t.Errorf("touches(%d ms, %d ms) = %v, want %v", tt.start/ms, tt.end/ms, got, tt.want)
		}
	}
	if (slowSpans{}).touches(0, 1<<62) {
		t.Error("no spans touched something")
	}
}

func TestDeliveryLogSteady(t *testing.T) {
	s := slowSpans{spans: [][2]int64{{100 * ms, 200 * ms}}}
	var l deliveryLog
	l.add(0, 2*ms)           // clear: 2 ms
	l.add(150*ms, 151*ms)    // in the span
	l.add(90*ms, 130*ms)     // reaches into it
	l.add(220*ms, 221*ms)    // in its wake
	l.add(300*ms, 304*ms)    // clear: 4 ms
	l.add(400*ms, 400*ms+10) // clear: under a microsecond
	h := l.steady(s)
	m := newMerged()
	enc, err := h.encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.add(enc); err != nil {
		t.Fatal(err)
	}
	if m.Count() != 3 || m.maxMS() < 3.99 || m.maxMS() > 4.01 {
		t.Errorf("clear deliveries: %d, longest %v ms; want 3, 4 ms", m.Count(), m.maxMS())
	}
}

func TestDeliveryLogCap(t *testing.T) {
	l := deliveryLog{v: make([]int64, 2*logCap)}
	l.add(1, 2)
	if l.dropped != 1 || len(l.v) != 2*logCap {
		t.Errorf("past the cap: dropped %d, kept %d values", l.dropped, len(l.v))
	}
}

// TestProbe runs the probe itself: it samples, in order, until stopped.
func TestProbe(t *testing.T) {
	p := startProbe()
	if p == nil {
		if runtime.GOOS == "linux" {
			t.Fatal("no probe on Linux")
		}
		if s := p.finish(); s.probes != 0 {
			t.Fatalf("a nil probe found %d samples", s.probes)
		}
		return
	}
	deadline := time.Now().Add(time.Minute)
	for {
		p.mu.Lock()
		n := len(p.samples)
		p.mu.Unlock()
		if n >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d samples after a minute", n)
		}
		time.Sleep(probeEvery)
	}
	s := p.finish()
	if s.probes < 20 || s.median <= 0 || s.to <= s.from {
		t.Fatalf("probes %d, median %d ns, from %d to %d", s.probes, s.median, s.from, s.to)
	}
	p.mu.Lock()
	for i := 1; i < len(p.samples); i++ {
		if p.samples[i].at <= p.samples[i-1].at || p.samples[i].cost <= 0 {
			t.Fatalf("sample %d: %+v after %+v", i, p.samples[i], p.samples[i-1])
		}
	}
	p.mu.Unlock()
	// Stopped: no more samples.
	p.mu.Lock()
	n := len(p.samples)
	p.mu.Unlock()
	if n != s.probes {
		t.Errorf("%d samples after finish, %d before", n, s.probes)
	}
}
