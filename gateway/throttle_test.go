package gateway

import (
	"testing"
	"time"
)

// TestThrottle: the first event goes through, then at most one a period,
// counted from the last one that went through.
func TestThrottle(t *testing.T) {
	th := throttle{period: 10 * time.Second}
	t0 := time.Unix(1_000_000, 0)
	for _, tc := range []struct {
		at   time.Duration
		want bool
	}{
		{0, true},
		{100 * time.Millisecond, false},
		{9*time.Second + 999*time.Millisecond, false},
		{10 * time.Second, true},
		{15 * time.Second, false},
		{25 * time.Second, true},
		{time.Hour, true},
		{time.Hour + time.Second, false},
	} {
		if got := th.allow(t0.Add(tc.at)); got != tc.want {
			t.Errorf("event at %v let through: %v, want %v", tc.at, got, tc.want)
		}
	}
}
