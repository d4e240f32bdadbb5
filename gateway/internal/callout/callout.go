// Package callout asks the app who may watch whom (the app policy), and
// who a connecting client is (the connect proxy, connect.go), over HTTP or
// NATS request/reply, with the same JSON both ways:
//
//	{"watcher":"alice","targets":["bob","carol"]}  ->  {"allow":["bob"]}
//	{"watcher":"alice","list":true}                ->  {"allow":["bob", ...]}
//
// HTTP questions are signed with a shared secret (pkg/signature); the
// gateway checks the app's invalidation calls with the same signature.
package callout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/signature"
)

// maxAnswer bounds the body of an answer, in bytes.
const maxAnswer = 1 << 20

// Question is what the app is asked.
type Question struct {
	Watcher string   `json:"watcher"`
	Targets []string `json:"targets,omitempty"`
	List    bool     `json:"list,omitempty"`
}

// Answer is what the app answers: the users allowed.
type Answer struct {
	Allow *[]string `json:"allow"`
}

// Observer is told of every question: its transport ("http" or "nats"),
// how long it took, and its error (nil when answered well).
type Observer func(transport string, took time.Duration, err error)

// parse reads an answer: a JSON object whose "allow" is a list of valid
// user ids. For a question about targets, only those are kept; a list is
// cut to max.
func parse(data []byte, q *Question, max int) ([]string, error) {
	var a Answer
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("answer is not {\"allow\": [user ids]}: %v", err)
	}
	if a.Allow == nil {
		return nil, errors.New(`answer has no "allow" list`)
	}
	asked := make(map[string]bool, len(q.Targets))
	for _, t := range q.Targets {
		asked[t] = true
	}
	var out []string
	for _, u := range *a.Allow {
		if !presence.ValidUserID(u) {
			return nil, fmt.Errorf("answer allows %q, not a valid user id", u)
		}
		if q.List && len(out) < max || asked[u] {
			out = append(out, u)
		}
	}
	return out, nil
}

// asker sends one question and returns the answer's body.
type asker interface {
	ask(ctx context.Context, body []byte) ([]byte, error)
	transport() string
}

// Client asks the app. It is safe for concurrent use.
type Client struct {
	a       asker
	timeout time.Duration
	observe Observer
}

// Allowed asks which of targets watcher may watch.
func (c *Client) Allowed(ctx context.Context, watcher string, targets []string) ([]string, error) {
	return c.question(ctx, &Question{Watcher: watcher, Targets: targets}, 0)
}

// List asks for the users watcher may watch, and keeps the first max.
func (c *Client) List(ctx context.Context, watcher string, max int) ([]string, error) {
	return c.question(ctx, &Question{Watcher: watcher, List: true}, max)
}

func (c *Client) question(ctx context.Context, q *Question, max int) ([]string, error) {
	var out []string
	err := c.call(ctx, q, func(data []byte) (err error) {
		out, err = parse(data, q, max)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// call sends q, encoded in JSON, within the client's timeout, and hands
// the answer's body to parse; the observer is told of it, and of parse's
// error.
func (c *Client) call(ctx context.Context, q any, parse func([]byte) error) error {
	body, err := json.Marshal(q)
	if err != nil {
		return fmt.Errorf("encode question: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	data, err := c.a.ask(ctx, body)
	if err == nil {
		err = parse(data)
	}
	if c.observe != nil {
		c.observe(c.a.transport(), time.Since(start), err)
	}
	if err != nil {
		return fmt.Errorf("%s callout: %w", c.a.transport(), err)
	}
	return nil
}

// HTTPConfig configures a callout over HTTP.
type HTTPConfig struct {
	// URL is where questions are POSTed.
	URL string
	// Secret signs them.
	Secret []byte
	// Timeout bounds one question, retries included.
	Timeout time.Duration
	// Observe, when set, is told of every question.
	Observe Observer
}

// NewHTTP returns a client that POSTs questions to cfg.URL. It follows no
// redirect: that would send the signed question elsewhere; a 3xx answer is
// an error, as any status but 200.
func NewHTTP(cfg HTTPConfig) *Client {
	hc := &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &Client{
		a:       &httpAsker{url: cfg.URL, secret: cfg.Secret, hc: hc},
		timeout: cfg.Timeout,
		observe: cfg.Observe,
	}
}

type httpAsker struct {
	url    string
	secret []byte
	hc     *http.Client
}

func (h *httpAsker) transport() string { return "http" }

// retryAfter is the first pause before a retry; each doubles it.
const retryAfter = 50 * time.Millisecond

// ask POSTs body, again after a connection error or a 502, 503 or 504,
// until ctx ends: those mean the question did not reach the app, or that
// it could not answer, and asking is safe to repeat.
func (h *httpAsker) ask(ctx context.Context, body []byte) ([]byte, error) {
	pause := retryAfter
	for {
		data, retry, err := h.once(ctx, body)
		if err == nil || !retry {
			return data, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%v (no answer within the timeout)", err)
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// once POSTs body once, and reports whether a failure may be retried.
func (h *httpAsker) once(ctx context.Context, body []byte) ([]byte, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, false, fmt.Errorf("request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(signature.Header, signature.Sign(h.secret, time.Now(), body))
	resp, err := h.hc.Do(req)
	if err != nil {
		return nil, ctx.Err() == nil, fmt.Errorf("POST %s: %w", h.url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	switch {
	case err != nil:
		return nil, ctx.Err() == nil, fmt.Errorf("POST %s: read answer: %w", h.url, err)
	case resp.StatusCode == http.StatusBadGateway, resp.StatusCode == http.StatusServiceUnavailable, resp.StatusCode == http.StatusGatewayTimeout:
		return nil, true, fmt.Errorf("POST %s: %s", h.url, resp.Status)
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return nil, false, fmt.Errorf("POST %s: %s: redirects are not followed", h.url, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return nil, false, fmt.Errorf("POST %s: %s: %s", h.url, resp.Status, strings.TrimSpace(string(data[:min(len(data), 200)])))
	case len(data) > maxAnswer:
		return nil, false, fmt.Errorf("POST %s: answer over %d bytes", h.url, maxAnswer)
	}
	return data, false, nil
}

// NATSConfig configures a callout over NATS request/reply.
type NATSConfig struct {
	// Conn is the connection questions are sent on.
	Conn *nats.Conn
	// Subject is where they are sent.
	Subject string
	// Timeout bounds one question.
	Timeout time.Duration
	// Observe, when set, is told of every question.
	Observe Observer
}

// NewNATS returns a client that sends questions to cfg.Subject.
func NewNATS(cfg NATSConfig) *Client {
	return &Client{
		a:       &natsAsker{nc: cfg.Conn, subject: cfg.Subject},
		timeout: cfg.Timeout,
		observe: cfg.Observe,
	}
}

type natsAsker struct {
	nc      *nats.Conn
	subject string
}

func (n *natsAsker) transport() string { return "nats" }

// ask sends body as a request and returns the reply. A reply with the
// error headers of a micro service is an error.
func (n *natsAsker) ask(ctx context.Context, body []byte) ([]byte, error) {
	msg, err := n.nc.RequestWithContext(ctx, n.subject, body)
	if err != nil {
		return nil, fmt.Errorf("request on %s: %w", n.subject, err)
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		return nil, fmt.Errorf("request on %s: error %s: %s", n.subject, code, msg.Header.Get("Nats-Service-Error"))
	}
	if len(msg.Data) > maxAnswer {
		return nil, fmt.Errorf("request on %s: answer over %d bytes", n.subject, maxAnswer)
	}
	return msg.Data, nil
}
