package authz

import (
	"context"
	"fmt"
	"maps"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/gateway/internal/hub"
)

// A re-check that could not read what it needs (NATS slow or away) is
// not dropped: the subscription would stay as it was, and a watcher no
// longer allowed would keep watching until its socket closed. It is
// queued and tried again, after a pause that doubles from retryFirst to
// retryMax, until it decides or the subscription ends. One goroutine
// tries them, and only while some are queued.
const (
	retryFirst = 250 * time.Millisecond
	retryMax   = 5 * time.Second
	// retryTimeout bounds the reads of one try: the retries have no
	// caller whose context would.
	retryTimeout = 10 * time.Second
)

// retryKey is a subscription whose re-check is queued: a socket and the
// user it watches.
type retryKey struct {
	w      hub.Watcher
	target string
}

// retryLater queues k's re-check to be tried again, under a new mark: a
// decision begun before this failure may not settle it (see settle).
func (a *Authorizer) retryLater(k retryKey) {
	a.mu.Lock()
	a.retrySeq++
	a.retries[k] = a.retrySeq
	start := !a.retrying && !a.closed
	a.retrying = a.retrying || start
	a.mu.Unlock()
	if start {
		a.loops.Go(a.retryLoop)
	}
}

// queued returns the mark of k's queued re-check; zero if none.
func (a *Authorizer) queued(k retryKey) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.retries[k]
}

// settle applies d, a re-check's decision of k, begun when k's queued
// re-check had the mark before (zero: none). A re-check that failed is
// queued to be tried again, unless it refused: a refusal holds even then
// (see Decision.refused). A decision is not applied when k's re-check
// failed again while it was made: the retry of that failure, newer,
// decides. A socket to be shown k's target again is gathered in again.
func (a *Authorizer) settle(k retryKey, before uint64, d Decision, err error, again *showing) {
	if err != nil && !d.refused() {
		a.retryLater(k)
		return
	}
	a.mu.Lock()
	if a.retries[k] > before {
		a.mu.Unlock()
		return
	}
	delete(a.retries, k)
	tell := a.changeLocked(k, d, again)
	a.mu.Unlock()
	tell()
}

// retryLoop tries the queued re-checks again until none is left, or the
// authorizer is closed.
func (a *Authorizer) retryLoop() {
	pause := retryFirst
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		left, err := a.retryRound()
		if left == 0 {
			return
		}
		if err == nil {
			// Those left were queued meanwhile: they fail for the
			// first time.
			pause = retryFirst
			t.Reset(pause)
			continue
		}
		pause = min(2*pause, retryMax)
		a.cfg.Logger.Warn("recheck subscriptions again", "left", left, "err", err, "retry_in", pause)
		t.Reset(pause)
	}
}

// retryRound tries each queued re-check once, and returns how many are
// left and the first failure. With none left the loop ends: retrying is
// cleared under the same lock, so that a re-check queued after it starts
// a new loop.
func (a *Authorizer) retryRound() (int, error) {
	a.mu.Lock()
	due := maps.Clone(a.retries)
	a.mu.Unlock()
	var g errgroup.Group
	g.SetLimit(readConcurrency)
	for k, seq := range due {
		g.Go(func() error { return a.retryOne(k, seq) })
	}
	err := g.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.retries) == 0 {
		a.retrying = false
	}
	return len(a.retries), err
}

// retryOne tries k's re-check, queued with the mark seq, again. It gives
// up on a subscription that ended (the socket closed or unsubscribed, or
// another re-check ended it), and decides again when the graph changed
// while it decided.
func (a *Authorizer) retryOne(k retryKey, seq uint64) error {
	for range maxAttempts {
		if k.w.Closed() || !a.cfg.Hub.Watching(k.w, k.target) {
			a.dropRetry(k, seq)
			return nil
		}
		a.mu.Lock()
		gen, still := a.gen, a.retries[k] == seq
		a.mu.Unlock()
		if !still {
			return nil // settled, or queued again, by another re-check
		}
		ctx, cancel := context.WithTimeout(a.ctx, retryTimeout)
		d, err := a.Decide(withListOf(ctx, k.w), k.w.UserID(), k.target)
		cancel()
		if err != nil && !d.refused() {
			return fmt.Errorf("recheck %s -> %s: %w", k.w.UserID(), k.target, err)
		}
		if a.settleRetry(k, seq, gen, d) {
			return nil
		}
	}
	return fmt.Errorf("recheck %s -> %s: %w", k.w.UserID(), k.target, ErrGraphBusy)
}

// settleRetry applies d, decided by a retry of k queued with the mark seq
// and begun at the generation gen, and reports whether the retry is done:
// d was applied, or k's re-check was settled or queued again meanwhile.
// It reports false, applying nothing, when the graph changed while d was
// decided: d may be older than what that change's own re-check applied,
// and would undo it (show a last_seen just hidden).
func (a *Authorizer) settleRetry(k retryKey, seq, gen uint64, d Decision) bool {
	a.mu.Lock()
	if a.retries[k] != seq {
		a.mu.Unlock()
		return true
	}
	if a.gen != gen {
		a.mu.Unlock()
		return false
	}
	delete(a.retries, k)
	var again showing
	tell := a.changeLocked(k, d, &again)
	a.mu.Unlock()
	tell()
	a.show(&again)
	return true
}

// dropRetry forgets k's re-check, queued with the mark seq, unless it was
// queued again since.
func (a *Authorizer) dropRetry(k retryKey, seq uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.retries[k] == seq {
		delete(a.retries, k)
	}
}
