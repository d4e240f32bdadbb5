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

	"github.com/greendot/greendot/internal/version"
	"github.com/greendot/greendot/pkg/signature"
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
		if err := s.limiter.Wait(s.quitting); err != nil {
			return false
		}
		status, retryAfter, err := s.post(body, attempt)
		s.metrics.attempts.Inc()
		switch {
		case s.quitting.Err() != nil:
			return false
		case err == nil && status >= 200 && status < 300:
			s.delivered(batch, attempt)
			return true
		case err == nil && permanent(status):
			s.metrics.failures.WithLabelValues(failureReason(status, nil)).Inc()
			s.deadLetter(batch, attempt, status, "refused")
			return true
		}
		reason := failureReason(status, err)
		s.metrics.failures.WithLabelValues(reason).Inc()
		wait := backoff + rand.N(backoff/5+1)
		if retryAfter > 0 {
			// MaxBackoff bounds it too: an endpoint that asks for more
			// than the time left would have the batch given up at once.
			wait = min(retryAfter, s.cfg.MaxBackoff)
		}
		if time.Since(first)+wait > s.cfg.GiveUpAfter {
			s.deadLetter(batch, attempt, status, fmt.Sprintf("gave up after %v: %s", time.Since(first).Round(time.Millisecond), reason))
			return true
		}
		s.log.Warn("webhook delivery failed; retrying", "attempt", attempt, "status", status, "err", err,
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
	req.Header.Set(signature.Header, signature.Sign(s.cfg.Secret, time.Now(), body))
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
		users[i] = it.ev.UserID + "@" + strconv.FormatUint(it.ev.Rev, 10)
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
