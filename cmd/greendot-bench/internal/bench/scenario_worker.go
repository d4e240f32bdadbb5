package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
)

// subscribe makes every connected watcher subscribe to the targets it
// follows, in messages of at most subscribeChunk ids, and waits for each
// answer.
func (w *worker) subscribe(timeout time.Duration) Reply {
	var subscribed, failed atomic.Int64
	deadline := time.Now().Add(timeout)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for _, v := range w.watchers {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := w.subscribeOne(v, deadline); err != nil {
				failed.Add(1)
				w.errs.add("subscribe %s: %v", v.user, err)
				return
			}
			subscribed.Add(1)
		})
	}
	wg.Wait()
	return w.reply(map[string]int64{
		"watchers":   int64(len(w.watchers)),
		"subscribed": subscribed.Load(),
		"failed":     failed.Load(),
	}, nil)
}

// subscribeOne sends v's subscribe messages and, unless deadline is zero,
// waits for their answers until deadline.
func (w *worker) subscribeOne(v *vconn, deadline time.Time) error {
	ids := make([]string, len(v.follows))
	for i, t := range v.follows {
		ids[i] = w.l.User(RoleTarget, t)
	}
	for k := 0; k*subscribeChunk < len(ids); k++ {
		chunk := ids[k*subscribeChunk : min(len(ids), (k+1)*subscribeChunk)]
		id := "s" + strconv.Itoa(k)
		ok, err := w.send(v, func(c *client.Conn) error { return c.Subscribe(id, chunk...) })
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("not connected")
		}
		if deadline.IsZero() {
			continue
		}
		if err := w.awaitInit(v, id, deadline); err != nil {
			return err
		}
	}
	return nil
}

// awaitInit waits for the answer to subscribe id.
func (w *worker) awaitInit(v *vconn, id string, deadline time.Time) error {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case a := <-v.inits:
			if a.id != id {
				continue // an answer to an earlier subscribe
			}
			if a.err != "" {
				return fmt.Errorf("refused: %s", a.err)
			}
			return nil
		case <-timer.C:
			return fmt.Errorf("no presence_init within the timeout")
		case <-w.ctx.Done():
			return w.ctx.Err()
		}
	}
}

// nextStatus returns the status after cur in statusCycle.
func nextStatus(cur presence.Status) presence.Status {
	for i, s := range statusCycle {
		if s == cur {
			return statusCycle[(i+1)%len(statusCycle)]
		}
	}
	return statusCycle[0]
}

// mismatches counts (watcher, target) pairs where the watcher's view is not
// the target's newest status.
func (w *worker) mismatches() int64 {
	var n int64
	w.eachWatched(func(v *vconn, t int, tv *vconn) {
		tv.mu.Lock()
		up := tv.cur != nil
		tv.mu.Unlock()
		if !up {
			return
		}
		want := w.sent[t-w.tlo].current()
		v.vmu.Lock()
		got := v.view[t]
		v.vmu.Unlock()
		if got != want {
			n++
		}
	})
	return n
}

// eachWatched calls fn for each (watcher, target) pair of a connected
// watcher: v the watcher, t the target's index and tv its connection.
func (w *worker) eachWatched(fn func(v *vconn, t int, tv *vconn)) {
	for _, v := range w.watchers {
		v.mu.Lock()
		up := v.cur != nil
		v.mu.Unlock()
		if !up {
			continue
		}
		for _, t := range v.follows {
			fn(v, t, w.targets[t-w.tlo])
		}
	}
}

// propagate changes the targets' statuses, round robin, at rate per second
// for d, then waits up to settle for every watcher to see the newest
// status of every target it follows.
func (w *worker) propagate(rate float64, d, settle time.Duration) Reply {
	lat, lag := newHist(), newHist()
	defer w.measure(phasePropagate, lat)()
	speed := w.watchSpeed()
	var sent, expected, skipped int64
	if n := len(w.targets); n > 0 {
		w.pace(rate, d, -1, lag, func(i int) {
			t := i % n
			v := w.targets[t]
			log := &w.sent[t]
			st := nextStatus(log.current())
			ok, err := w.send(v, func(c *client.Conn) error {
				log.record(st, time.Now().UnixNano())
				return c.SetStatus(string(st))
			})
			switch {
			case err != nil:
				w.errs.add("set_status of %s: %v", v.user, err)
				skipped++
			case !ok:
				skipped++
			default:
				sent++
				expected += int64(w.watchersOf[t])
			}
		})
	}
	converged := w.waitFor(settle, func() bool { return w.mismatches() == 0 })
	counts, hists := map[string]int64{}, map[string]*hist{"latency": lat, "send_lag": lag}
	speed(counts, hists) // before the deliveries are counted: none logged goes uncounted
	counts["sent"], counts["skipped"], counts["expected"] = sent, skipped, expected
	counts["delivered"], counts["stale"] = w.deliveries.Swap(0), w.stale.Swap(0)
	counts["mismatches"] = w.mismatches()
	if !converged {
		w.errs.add("watchers had not all seen the newest statuses after %v", settle)
	}
	return w.reply(counts, hists)
}

// death stops the targets' heartbeats without closing their sockets, and
// waits up to timeout for every watcher to see each target it follows
// offline. Latencies are from the moment the gateway may first call a
// target dead: its last frame plus the connection TTL.
func (w *worker) death(timeout time.Duration) Reply {
	lat := newHist()
	w.latency.Store(lat)
	w.phase.Store(phaseDeath)
	defer w.latency.Store(nil)
	ttl := w.ttl.Load()
	var silenced int64
	for _, v := range w.targets {
		v.mu.Lock()
		if v.cur != nil {
			v.silent = true
			v.deadline = v.lastSent + ttl
			silenced++
		}
		v.mu.Unlock()
	}
	var expected int64
	w.eachWatched(func(_ *vconn, _ int, tv *vconn) {
		tv.mu.Lock()
		if tv.silent {
			expected++
		}
		tv.mu.Unlock()
	})
	w.waitFor(timeout, func() bool { return w.deadSeen.Load() >= expected })
	seen := w.deadSeen.Swap(0)
	w.phase.Store(phaseHold)
	return w.reply(map[string]int64{
		"silenced": silenced,
		"expected": expected,
		"seen":     seen,
		"ttl_ns":   ttl,
	}, map[string]*hist{"offline_after_ttl": lat})
}

// churn replaces the connections of targets and idle users at rate per
// second for d: each replacement dials a new connection for the user, and
// once its hello has arrived closes the old one cleanly, so the user always
// has a live connection and any offline a watcher sees is false. It then
// waits settle, long enough for a wrongly settled close to show.
func (w *worker) churn(rate float64, d, settle time.Duration) Reply {
	var pool []*vconn
	for _, v := range w.conns {
		if v.role != RoleWatcher {
			pool = append(pool, v)
		}
	}
	connectHist, lag := newHist(), newHist()
	var connects, closes, connectErrors, skipped atomic.Int64
	sem := make(chan struct{}, 512)
	var wg sync.WaitGroup
	replace := func(v *vconn) {
		defer func() { <-sem; v.busy.Store(false) }()
		start := time.Now()
		c, err := w.dial(v)
		if err != nil {
			connectErrors.Add(1)
			w.errs.add("dial %s: %v", v.user, err)
			return
		}
		connectHist.record(time.Since(start))
		connects.Add(1)
		if old := w.attach(v, c); old != nil {
			if closeGracefully(old) {
				closes.Add(1)
			}
		}
	}
	start := time.Now()
	if len(pool) > 0 {
		w.pace(rate, d, -1, lag, func(i int) {
			v := pool[i%len(pool)]
			if !v.busy.CompareAndSwap(false, true) {
				skipped.Add(1)
				return
			}
			select {
			case sem <- struct{}{}:
			default:
				v.busy.Store(false)
				skipped.Add(1)
				return
			}
			wg.Go(func() { replace(v) })
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// A close settled wrongly would show as offline after the grace.
	w.waitFor(settle, func() bool { return false })
	return w.reply(map[string]int64{
		"connects":       connects.Load(),
		"closes":         closes.Load(),
		"connect_errors": connectErrors.Load(),
		"skipped":        skipped.Load(),
		"elapsed_ns":     int64(elapsed),
	}, map[string]*hist{"connect": connectHist, "lag": lag})
}

// closeGracefully sends a close frame and waits for the gateway to answer
// and close the socket first, so that the port is not left in TIME_WAIT
// here; it resets the socket if the gateway does not answer in time. It
// reports whether the gateway answered.
func closeGracefully(l *live) bool {
	_ = l.c.NetConn().SetWriteDeadline(time.Now().Add(writeTimeout))
	err := l.c.SendRaw(ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))
	answered := false
	if err == nil {
		select {
		case <-l.done:
			answered = true
		case <-time.After(closeWait):
		}
	}
	if !answered {
		l.abort(true)
		<-l.done
		return false
	}
	l.abort(false)
	return true
}

// storm arms the worker for a restart of the given gateways: each
// connection to them that is lost from now on is dialed again after a
// random delay below jitter, and again with the browser client's backoff
// while that fails, until timeout. Watchers subscribe again once
// connected.
func (w *worker) storm(gateways []int, jitter, timeout time.Duration) Reply {
	if w.phase.Load() == phaseStorm {
		return Reply{Err: "a storm is already in progress"}
	}
	gws := make(map[int]bool, len(gateways))
	for _, g := range gateways {
		gws[g] = true
	}
	w.stormGW, w.stormEnd, w.stormJitter = gws, time.Now().Add(timeout), jitter
	w.reconnHist = newHist()
	w.reconnected.Store(0)
	w.attempts.Store(0)
	w.lastHello.Store(0)
	w.firstDown.Store(0)
	var expected int64
	for _, v := range w.conns {
		if !gws[v.gw] {
			continue
		}
		v.mu.Lock()
		if v.cur != nil {
			v.storm = true
			expected++
		}
		v.mu.Unlock()
	}
	w.stormExpected = expected
	w.phase.Store(phaseStorm)
	return w.reply(map[string]int64{"expected": expected}, nil)
}

// stormWait waits until every connection the storm expected to lose is
// connected again, or the storm's timeout.
func (w *worker) stormWait() Reply {
	if w.phase.Load() != phaseStorm {
		return Reply{Err: "no storm in progress"}
	}
	expected := w.stormExpected
	w.waitFor(time.Until(w.stormEnd), func() bool { return w.reconnected.Load() >= expected })
	w.phase.Store(phaseHold)
	w.reconnWG.Wait() // each gives up at stormEnd
	var stillArmed int64
	for _, v := range w.conns {
		v.mu.Lock()
		if v.storm {
			v.storm = false
			stillArmed++
		}
		v.mu.Unlock()
	}
	return w.reply(map[string]int64{
		"expected":      expected,
		"reconnected":   w.reconnected.Load(),
		"never_closed":  stillArmed,
		"attempts":      w.attempts.Load(),
		"first_down_ns": w.firstDown.Load(),
		"last_hello_ns": w.lastHello.Load(),
		"offline_seen":  w.offlineSeen.Swap(0),
	}, map[string]*hist{"reconnect": w.reconnHist})
}

// The reconnection backoff of greendot's browser client: the n-th retry
// waits a random time below min(backoffMax, backoffBase * 2^n).
const (
	backoffBase = 500 * time.Millisecond
	backoffMax  = 30 * time.Second
)

// reconnect dials v again after a storm closed it at down.
func (w *worker) reconnect(v *vconn, down int64) {
	defer w.reconnWG.Done()
	wait := time.Duration(0)
	if w.stormJitter > 0 {
		wait = rand.N(w.stormJitter)
	}
	attempt := 0
	for w.phase.Load() != phaseEnd {
		if wait > 0 {
			if time.Now().Add(wait).After(w.stormEnd) {
				return
			}
			select {
			case <-time.After(wait):
			case <-w.ctx.Done():
				return
			}
		}
		w.attempts.Add(1)
		c, err := w.dial(v)
		if err == nil {
			now := time.Now().UnixNano()
			w.reconnHist.record(time.Duration(now - down))
			w.attach(v, c)
			for {
				last := w.lastHello.Load()
				if last >= now || w.lastHello.CompareAndSwap(last, now) {
					break
				}
			}
			w.reconnected.Add(1)
			if v.role == RoleWatcher {
				if err := w.subscribeOne(v, time.Time{}); err != nil {
					w.errs.add("subscribe %s again: %v", v.user, err)
				}
			}
			return
		}
		// As greendot's browser client does (web/greendot.js): capped
		// exponential backoff with full jitter.
		attempt++
		wait = rand.N(min(backoffMax, backoffBase<<min(attempt, 16)))
	}
}

// shutdown stops the heartbeats, closes every connection with a reset and
// waits for the readers. It may be called more than once.
func (w *worker) shutdown() {
	w.smu.Lock()
	w.phase.Store(phaseEnd)
	w.smu.Unlock()
	if w.hbStop != nil {
		close(w.hbStop)
		w.hbDone.Wait()
		w.hbStop = nil
	}
	// Reconnections end at phaseEnd; none starts after it.
	w.reconnWG.Wait()
	for _, v := range w.conns {
		v.mu.Lock()
		l := v.cur
		v.cur = nil
		v.mu.Unlock()
		if l != nil {
			// With a reset, leaving no TIME_WAIT.
			l.abort(true)
		}
	}
	w.readers.Wait()
	w.stopPoller()
}
