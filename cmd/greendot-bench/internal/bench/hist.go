package bench

import (
	"fmt"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histograms record durations in microseconds, from 1 µs to 1 hour, with
// three significant digits.
const (
	histMin     = 1
	histMax     = int64(time.Hour / time.Microsecond)
	histSigFigs = 3
)

// hist is a latency histogram safe for concurrent use. Values below zero
// are counted apart (a receiver's clock cannot run before the sender's on
// one machine, so they mean a misattributed sample) and recorded as zero.
type hist struct {
	mu       sync.Mutex
	h        *hdrhistogram.Histogram
	negative int64
}

func newHist() *hist { return &hist{h: hdrhistogram.New(histMin, histMax, histSigFigs)} }

// record adds one duration.
func (h *hist) record(d time.Duration) {
	us := d.Microseconds()
	h.mu.Lock()
	defer h.mu.Unlock()
	if us < 0 {
		h.negative++
		us = 0
	}
	_ = h.h.RecordValue(min(us, histMax)) // clamped, so it cannot fail
}

// encode returns the histogram in HdrHistogram's compressed V2 encoding.
func (h *hist) encode() ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
}

// merged is the union of histograms from several workers.
type merged struct {
	h *hdrhistogram.Histogram
}

func newMerged() *merged { return &merged{h: hdrhistogram.New(histMin, histMax, histSigFigs)} }

// add merges an encoded histogram.
func (m *merged) add(enc []byte) error {
	h, err := hdrhistogram.Decode(enc)
	if err != nil {
		return fmt.Errorf("decode histogram: %w", err)
	}
	if dropped := m.h.Merge(h); dropped > 0 {
		return fmt.Errorf("merge histogram: %d values out of range", dropped)
	}
	return nil
}

// Count returns how many values were recorded.
func (m *merged) Count() int64 { return m.h.TotalCount() }

// ms returns the value at quantile q (0 to 100) in milliseconds.
func (m *merged) ms(q float64) float64 {
	return float64(m.h.ValueAtQuantile(q)) / 1000
}

// maxMS returns the largest value in milliseconds.
func (m *merged) maxMS() float64 { return float64(m.h.Max()) / 1000 }
