package socket

import "time"

// Limiter limits how fast one connection may send frames: a token
// bucket, and strikes for the frames it refuses. The zero value is a full
// bucket. A Limiter is not safe for concurrent use: the goroutine reading
// the connection owns it.
type Limiter struct {
	tokenAt int64 // unix ns of the last refill; 0 before the first message
	strikeW int64 // unix ns when the strike window started
	tokens  float32
	strikes int32 // refusals in the current strike window
}

// Allow takes a token at now (unix ns) from a bucket that holds at most
// burst tokens and refills at rate per second, and reports whether there
// was one.
func (l *Limiter) Allow(now int64, rate float64, burst int) bool {
	if l.tokenAt == 0 {
		l.tokens, l.tokenAt = float32(burst), now
	}
	l.tokens = min(float32(burst), l.tokens+float32(float64(now-l.tokenAt)/1e9*rate))
	l.tokenAt = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// strikeWindow is how long strikes are counted before they start over.
const strikeWindow = time.Minute

// Strike counts a refused frame at now (unix ns) and reports whether the
// connection has now earned more than max strikes within the window: it
// is then to be closed.
func (l *Limiter) Strike(now int64, max int) bool {
	if now-l.strikeW > int64(strikeWindow) {
		l.strikeW, l.strikes = now, 0
	}
	l.strikes++
	return int(l.strikes) > max
}
