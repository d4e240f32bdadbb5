package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/pkg/version"
)

// Headers of a delivery besides signature.Header.
const (
	// AttemptHeader numbers the attempts of one delivery, from 1.
	AttemptHeader = "Greendot-Attempt"
)

// deliver POSTs a batch until the endpoint answers 2xx, then acknowledges
// its revisions, and returns true. A batch the endpoint refuses for good
// (4xx other than 408 and 429), or that keeps failing for GiveUpAfter, is
// dead-lettered: counted, logged with its users and revisions, and
// acknowledged so that it is never sent again; deliver returns true. It
// returns false, acknowledging nothing, when the process stops first.
func (s *Service) deliver(batch []*item) bool {
	body, err := encode(batch)
	if err != nil {
		s.deadLetter(batch, 0, 0, fmt.Sprintf("encode: %v", err))
		return true
	}
	first := time.Now()
	backoff := s.cfg.MinBackoff
	for attempt := 1; ; attempt++ {
		a, ok := s.attempt(body, attempt)
		switch {
		case !ok:
			return false
		case a.delivered():
			s.delivered(batch, attempt)
			return true
		case a.refused():
			s.deadLetter(batch, attempt, a.status, "refused")
			return true
		}
		wait := retryWait(backoff, a.retryAfter, s.cfg.MaxBackoff)
		if time.Since(first)+wait > s.cfg.GiveUpAfter {
			s.deadLetter(batch, attempt, a.status, fmt.Sprintf("gave up after %v: %s", time.Since(first).Round(time.Millisecond), failureReason(a.status, a.err)))
			return true
		}
		s.log.Warn("webhook delivery failed; retrying", "attempt", attempt, "status", a.status, "err", a.err,
			"retry_in", wait.Round(time.Millisecond), "events", len(batch), "first_rev", batch[0].ev.Rev)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.quit:
			t.Stop()
			return false
		}
		backoff = min(backoff*2, s.cfg.MaxBackoff)
	}
}

// answer is how the endpoint answered one attempt: its status and
// Retry-After, or the error that kept the answer from being read.
type answer struct {
	status     int
	retryAfter time.Duration
	err        error
}

// delivered reports whether the endpoint took the batch (2xx).
func (a answer) delivered() bool { return a.err == nil && a.status >= 200 && a.status < 300 }

// refused reports whether the endpoint refused the batch for good.
func (a answer) refused() bool { return a.err == nil && permanent(a.status) }

// attempt POSTs body as attempt n, under the rate limit, and counts it,
// and its failure if it failed. It reports false, counting no failure,
// when the process stops before or while it is made.
func (s *Service) attempt(body []byte, n int) (answer, bool) {
	if err := s.limiter.Wait(s.quitting); err != nil {
		return answer{}, false
	}
	var a answer
	a.status, a.retryAfter, a.err = s.post(body, n)
	s.metrics.attempts.Inc()
	if s.quitting.Err() != nil {
		return a, false
	}
	if !a.delivered() {
		s.metrics.failures.WithLabelValues(failureReason(a.status, a.err)).Inc()
	}
	return a, true
}

// retryWait is how long to wait before trying again after a failure:
// backoff with up to a fifth more at random, or the endpoint's
// Retry-After, either bounded by maxBackoff (an endpoint that asks for
// more than the time left would have its batch given up at once). The
// bound comes after the jitter, so that maxBackoff is the longest wait.
func retryWait(backoff, retryAfter, maxBackoff time.Duration) time.Duration {
	if retryAfter > 0 {
		return min(retryAfter, maxBackoff)
	}
	return min(backoff+rand.N(backoff/5+1), maxBackoff)
}

// userRev names a user's revision as user@rev, for logs.
func userRev(user string, rev uint64) string { return user + "@" + strconv.FormatUint(rev, 10) }

// encode returns a batch's JSON body.
func encode(batch []*item) ([]byte, error) {
	b := Batch{Events: make([]Event, len(batch))}
	for i, it := range batch {
		b.Events[i] = it.ev
	}
	return json.Marshal(b)
}

// post sends one attempt and returns the response's status, its
// Retry-After when the status is 429 or 503, or the error that kept it
// from being read.
func (s *Service) post(body []byte, attempt int) (status int, retryAfter time.Duration, err error) {
	req, err := http.NewRequestWithContext(s.quitting, http.MethodPost, s.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "greendot-webhooks/"+version.String())
	req.Header.Set(AttemptHeader, strconv.Itoa(attempt))
	req.Header.Set(signature.Header, s.sign(body))
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	// Read a little of the body so that the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	}
	return resp.StatusCode, retryAfter, nil
}

// permanent reports whether a status refuses a delivery for good: a 4xx
// other than 408 (timeout) and 429 (too many requests).
func permanent(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
}

// failureReason names a failed attempt for the failures metric.
func failureReason(status int, err error) string {
	switch {
	case err != nil && isTimeout(err):
		return "timeout"
	case err != nil:
		return "network"
	case status == http.StatusTooManyRequests:
		return "http_429"
	case status >= 500:
		return "http_5xx"
	case status >= 400:
		return "http_4xx"
	default:
		return "http_other"
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout() || errors.Is(err, context.DeadlineExceeded)
}

// parseRetryAfter reads a Retry-After header: seconds, or an HTTP date.
// It returns zero when there is none or it cannot be read, and the
// longest duration for more seconds than a duration holds.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if n <= 0 {
			return 0
		}
		return time.Duration(min(n, math.MaxInt64/int64(time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// keepInProgress tells the server, every AckWait/3 until the returned
// function is called, that the revisions handed to work are being worked
// on (the batch under way, and those waiting for a batch), so that none is
// handed out again while it waits for its batch to fill, nor while a
// delivery retries.
func (s *Service) keepInProgress() (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(s.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range s.held.list() {
					_ = m.InProgress()
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// delivered acknowledges a delivered batch's revisions.
func (s *Service) delivered(batch []*item, attempts int) {
	now := time.Now()
	for _, it := range batch {
		s.settle(it.seq)
		_ = it.msg.Ack()
		s.held.remove(it.msg)
		if it.ev.At != 0 {
			s.metrics.lag.Observe(now.Sub(time.UnixMilli(it.ev.At)).Seconds())
		}
	}
	s.metrics.batches.Inc()
	s.metrics.events.Add(float64(len(batch)))
	s.resyncDelivered(batch)
	s.log.Debug("webhook delivered", "events", len(batch), "attempts", attempts,
		"first_rev", batch[0].ev.Rev, "last_rev", batch[len(batch)-1].ev.Rev)
}

// deadLetter gives a batch up: it is counted, logged with its users and
// revisions, and its revisions are terminated so that they are never
// handed out again. Its users are remembered, to send their current state
// once the endpoint takes deliveries again (see resync).
func (s *Service) deadLetter(batch []*item, attempts, status int, reason string) {
	users := make([]string, len(batch))
	for i, it := range batch {
		users[i] = userRev(it.ev.UserID, it.ev.Rev)
		s.settle(it.seq)
		_ = it.msg.Term()
		s.held.remove(it.msg)
	}
	s.metrics.deadLetters.Inc()
	s.metrics.deadEvents.Add(float64(len(batch)))
	s.log.Error("webhook batch dead-lettered", "reason", reason, "status", status, "attempts", attempts,
		"events", len(batch), "users", strings.Join(users, ","))
	s.remember(batch)
}

// sign returns the signature header of a delivery of body: signed with
// the secret, and with the previous one during a rotation.
func (s *Service) sign(body []byte) string {
	if len(s.cfg.PreviousSecret) > 0 {
		return signature.Sign(s.cfg.Secret, time.Now(), body, s.cfg.PreviousSecret)
	}
	return signature.Sign(s.cfg.Secret, time.Now(), body)
}
