package webhook

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// Config configures a webhooks process. URL and Secret are required; every
// other zero field stands for its value in DefaultConfig.
type Config struct {
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// Buckets says how buckets are created if they are missing.
	Buckets presence.BucketOptions
	// URL is the endpoint every delivery is POSTed to: http or https.
	URL string
	// Secret is the key of every delivery's HMAC-SHA256 signature; at
	// least MinSecretLen bytes.
	Secret []byte
	// PreviousSecret, when not empty, is a secret being rotated out: every
	// delivery carries a second v1 signed with it, so that a receiver
	// still checking with it goes on accepting deliveries until it has
	// moved to Secret. At least MinSecretLen bytes.
	PreviousSecret []byte
	// Consumer is the name of the durable consumer on the stream
	// presence_feed, shared by every process serving this endpoint: where it
	// stopped is where the next one resumes. Each endpoint needs a name of
	// its own.
	Consumer string
	// Invisible says what is sent of an invisible user; empty means
	// InvisibleTrue.
	Invisible Invisible
	// Users, when not empty, are the users whose events are sent: user
	// ids, or patterns of them (CheckUserPattern), such as team_* or
	// *_bot. The revisions of others are acknowledged unsent.
	Users []string
	// Events, when not empty, are the kinds of change an event is sent
	// for: a revision that changes none of them since the user's revision
	// before is acknowledged unsent. A revision this process cannot
	// compare (the first of a user it sees, or one delivered again) is
	// sent.
	Events []EventType
	// BatchSize is the most events one delivery carries, and the most
	// revisions handed out and not yet acknowledged.
	BatchSize int
	// BatchWait is how long a delivery waits for more events after its
	// first before it is sent with fewer than BatchSize.
	BatchWait time.Duration
	// Timeout bounds one POST, from connecting to reading the response.
	Timeout time.Duration
	// MinBackoff is the wait after a first failed attempt; it doubles with
	// every further one, and each wait has up to a fifth more at random,
	// up to MaxBackoff. A 429 or 503 response's Retry-After replaces it,
	// up to MaxBackoff.
	MinBackoff time.Duration
	// MaxBackoff bounds the wait between attempts, its jitter and a
	// Retry-After's included.
	MaxBackoff time.Duration
	// GiveUpAfter is how long after its first attempt a delivery that keeps
	// failing is given up and dead-lettered; and how long after its last
	// dead letter a user's current state, which the process then sends,
	// is tried before it is given up too.
	GiveUpAfter time.Duration
	// RateLimit is the most POSTs per second sent to the endpoint,
	// retries included.
	RateLimit float64
	// AckWait is how long a revision may stay unacknowledged by a process
	// that stopped telling the server it works on it (every AckWait/3 while
	// it holds it) before the server hands it out again.
	AckWait time.Duration
	// PinnedTTL is how long after the process serving the consumer stopped
	// pulling another one takes over; one process serves at a time.
	PinnedTTL time.Duration
}

// MinSecretLen is the shortest secret accepted.
const MinSecretLen = 16

// DefaultConfig returns the configuration every zero field of a Config
// stands for (a nil Logger discards). The command line's flags take their
// defaults from it.
func DefaultConfig() Config {
	return Config{
		Consumer:    presence.WebhooksConsumer,
		Invisible:   InvisibleTrue,
		BatchSize:   100,
		BatchWait:   200 * time.Millisecond,
		Timeout:     10 * time.Second,
		MinBackoff:  500 * time.Millisecond,
		MaxBackoff:  time.Minute,
		GiveUpAfter: 24 * time.Hour,
		RateLimit:   10,
		AckWait:     30 * time.Second,
		PinnedTTL:   15 * time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Consumer = cmp.Or(c.Consumer, d.Consumer)
	c.Invisible = cmp.Or(c.Invisible, d.Invisible)
	c.BatchSize = cmp.Or(c.BatchSize, d.BatchSize)
	c.BatchWait = cmp.Or(c.BatchWait, d.BatchWait)
	c.Timeout = cmp.Or(c.Timeout, d.Timeout)
	c.MinBackoff = cmp.Or(c.MinBackoff, d.MinBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, d.MaxBackoff)
	c.GiveUpAfter = cmp.Or(c.GiveUpAfter, d.GiveUpAfter)
	c.RateLimit = cmp.Or(c.RateLimit, d.RateLimit)
	c.AckWait = cmp.Or(c.AckWait, d.AckWait)
	c.PinnedTTL = cmp.Or(c.PinnedTTL, d.PinnedTTL)
	return c
}

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("webhook: invalid config")

// Validate reports whether c is usable. Every error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	u, err := url.Parse(c.URL)
	switch {
	case c.URL == "":
		return bad("no URL")
	case err != nil:
		// url.Error repeats the URL, password included.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return bad("URL: %v", err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return bad("URL %q: want http:// or https:// and a host", u.Redacted())
	case len(c.Secret) < MinSecretLen:
		return bad("secret of %d bytes: want at least %d", len(c.Secret), MinSecretLen)
	case len(c.PreviousSecret) > 0 && len(c.PreviousSecret) < MinSecretLen:
		return bad("previous secret of %d bytes: want at least %d", len(c.PreviousSecret), MinSecretLen)
	case len(c.PreviousSecret) > 0 && bytes.Equal(c.PreviousSecret, c.Secret):
		return bad("the previous secret is the secret: give the one being rotated out, or none")
	case c.Consumer != "" && !presence.ValidToken(c.Consumer):
		return bad("consumer %q: want 1 to 64 of A-Z a-z 0-9 _ -", c.Consumer)
	case c.Consumer == presence.FanoutConsumer || c.Consumer == presence.ReaperConsumer:
		return bad("consumer %q is the %s's: give the webhooks a name of their own", c.Consumer, c.Consumer)
	case c.BatchSize < 0 || c.BatchSize > 10_000:
		return bad("batch size %d: want 1 to 10000", c.BatchSize)
	case c.BatchWait < 0 || c.BatchWait > time.Minute:
		return bad("batch wait %v: want 0 to 1m", c.BatchWait)
	case c.Timeout < 0, c.MinBackoff < 0, c.MaxBackoff < 0, c.GiveUpAfter < 0, c.AckWait < 0, c.PinnedTTL < 0:
		return bad("negative duration")
	case !(c.RateLimit >= 0): // NaN too
		return bad("rate limit %v: want a positive number of requests per second", c.RateLimit)
	}
	if c.Invisible != "" {
		if _, err := ParseInvisible(string(c.Invisible)); err != nil {
			return bad("%v", err)
		}
	}
	for _, p := range c.Users {
		if err := CheckUserPattern(p); err != nil {
			return bad("%v", err)
		}
	}
	for _, t := range c.Events {
		if _, err := ParseEventType(string(t)); err != nil {
			return bad("%v", err)
		}
	}
	d := c.withDefaults()
	switch {
	case d.MaxBackoff < d.MinBackoff:
		return bad("max backoff %v: want at least the min backoff %v", d.MaxBackoff, d.MinBackoff)
	case d.AckWait < 3*time.Second:
		return bad("ack wait %v: want at least 3s", d.AckWait)
	case d.AckWait <= d.BatchWait:
		return bad("ack wait %v: want more than the batch wait %v", d.AckWait, d.BatchWait)
	case d.PinnedTTL < 3*time.Second:
		return bad("pinned TTL %v: want at least 3s", d.PinnedTTL)
	}
	if err := c.Buckets.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// redactedURL returns the URL without a password, for logs.
func (c Config) redactedURL() string {
	u, err := url.Parse(c.URL)
	if err != nil {
		return ""
	}
	return u.Redacted()
}
