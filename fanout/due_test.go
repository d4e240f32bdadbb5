package fanout

import (
	"testing"
	"time"
)

// TestDueAt: a revision's events are due Delay after its write, on this
// host's clock; a server clock ahead of this host's never holds them more
// than Delay after they arrived.
func TestDueAt(t *testing.T) {
	const delay = 250 * time.Millisecond
	received := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		written time.Time
		want    time.Time
	}{
		{"arrived 20ms after its write", received.Add(-20 * time.Millisecond), received.Add(delay - 20*time.Millisecond)},
		{"arrived at its write", received, received.Add(delay)},
		{"a backlog, written a minute before", received.Add(-time.Minute), received.Add(delay - time.Minute)},
		{"the server's clock 5s ahead", received.Add(5 * time.Second), received.Add(delay)},
	} {
		if got := dueAt(tc.written, received, delay); !got.Equal(tc.want) {
			t.Errorf("%s: due %v after arrival, want %v", tc.name, got.Sub(received), tc.want.Sub(received))
		}
	}
}
