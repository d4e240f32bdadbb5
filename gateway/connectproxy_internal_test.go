package gateway

import (
	"testing"
	"time"
)

// TestRefreshAt: a session is refreshed a quarter of its lifetime before
// its expiry, at least twice the proxy's timeout before, and never in the
// first half of its lifetime.
func TestRefreshAt(t *testing.T) {
	exp := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		lifetime, timeout, before time.Duration
	}{
		{time.Hour, 2 * time.Second, 15 * time.Minute},
		{time.Minute, 2 * time.Second, 15 * time.Second},
		{20 * time.Second, 5 * time.Second, 10 * time.Second},
		{4 * time.Second, 2 * time.Second, 2 * time.Second},
		{2 * time.Second, 500 * time.Millisecond, time.Second},
	} {
		if got := exp.Sub(refreshAt(exp, tc.lifetime, tc.timeout)); got != tc.before {
			t.Errorf("lifetime %v, timeout %v: refreshed %v before the expiry, want %v", tc.lifetime, tc.timeout, got, tc.before)
		}
	}
}

// TestProxySessionsLetEndedGo: the refreshes of connections that ended
// are dropped as they pile up, not held until they are due.
func TestProxySessionsLetEndedGo(t *testing.T) {
	p := &connectProxy{timeout: time.Second, sessions: newProxySessions()}
	now := time.Now()
	conns := make([]*conn, 100)
	for i := range conns {
		conns[i] = &conn{}
		p.track(conns[i], "s", time.Hour, now.Add(time.Hour))
	}
	for _, c := range conns[:99] {
		p.forget(c)
	}
	if n := len(p.sessions.due); n > 2 {
		t.Errorf("%d refreshes held for 1 live connection", n)
	}
	if p.has(conns[0]) || !p.has(conns[99]) {
		t.Errorf("has: ended %v, live %v", p.has(conns[0]), p.has(conns[99]))
	}
	due, next := p.sessions.take(now.Add(2 * time.Hour))
	if len(due) != 1 || due[0].c != conns[99] || !next.IsZero() {
		t.Errorf("take = %+v, %v; want the live connection's refresh alone", due, next)
	}
}
