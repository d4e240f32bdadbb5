package bench

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestPaceNeverEarly checks that pace makes no call before it is due: the
// room scenario times what members are shown from the schedule, and a
// leave sent before its slot would be taken for the churner's previous
// one.
func TestPaceNeverEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &worker{ctx: t.Context()}
		start := time.Now()
		const rate = 1000 // a call due every millisecond
		var early []time.Duration
		n := w.paceFrom(start, rate, time.Second, 50, nil, func(i int) {
			due := start.Add(time.Duration(i) * time.Second / rate)
			if now := time.Now(); now.Before(due) {
				early = append(early, due.Sub(now))
			}
			// Each call takes some of the time to the next one.
			time.Sleep(300 * time.Microsecond)
		})
		if n != 50 {
			t.Errorf("%d calls, want 50", n)
		}
		if len(early) > 0 {
			t.Errorf("%d of %d calls were made before they were due, the first %v early", len(early), n, early[0])
		}
	})
}
