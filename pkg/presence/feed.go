package presence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultFeedMaxAge is how long FeedStream keeps a revision unless told
// otherwise: a receiver of the webhooks that is down for less loses none.
const DefaultFeedMaxAge = 72 * time.Hour

// MinFeedMaxAge is the shortest FeedStream retention accepted.
const MinFeedMaxAge = time.Minute

// ErrFeedNotFound is what Feed returns when FeedStream does not exist.
var ErrFeedNotFound = errors.New("stream " + FeedStream + " not found: create it with `greendot buckets --feed`")

// FeedConfig returns the configuration greendot wants for FeedStream: it
// sources StatusBucket's stream, keeps every revision for maxAge (zero
// means DefaultFeedMaxAge) whatever their number per user, on file
// storage with o's replicas.
func FeedConfig(o BucketOptions, maxAge time.Duration) (jetstream.StreamConfig, error) {
	if err := o.Validate(); err != nil {
		return jetstream.StreamConfig{}, err
	}
	if maxAge == 0 {
		maxAge = DefaultFeedMaxAge
	}
	if maxAge < MinFeedMaxAge {
		return jetstream.StreamConfig{}, fmt.Errorf("feed max age %v: want at least %v", maxAge, MinFeedMaxAge)
	}
	return jetstream.StreamConfig{
		Name:        FeedStream,
		Description: "greendot: every revision of presence_status, kept for the feed's max age, for the webhooks",
		Sources:     []*jetstream.StreamSource{{Name: StreamName(StatusBucket)}},
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      maxAge,
		// No per-subject limit: a user's revisions stay until they are
		// older than MaxAge, however many there are.
		MaxMsgsPerSubject: -1,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		Discard:           jetstream.DiscardOld,
		Storage:           jetstream.FileStorage,
		Replicas:          o.replicas(),
	}, nil
}

// EnsureFeed creates FeedStream, or updates its configuration when it
// differs from FeedConfig's, waits until it sources StatusBucket's stream,
// and returns it. It is idempotent. A maxAge of zero keeps an existing
// stream's max age (and is DefaultFeedMaxAge for a new one): shortening it
// would drop the revisions a receiver's outage left unsent. An existing
// stream keeps its storage too.
func EnsureFeed(ctx context.Context, js jetstream.JetStream, o BucketOptions, maxAge time.Duration) (jetstream.Stream, error) {
	cfg, err := FeedConfig(o, maxAge)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, FeedStream)
	switch {
	case err == nil:
		cur := st.CachedInfo().Config
		if maxAge == 0 {
			cfg.MaxAge = cur.MaxAge
		}
		cfg.Storage = cur.Storage
		if feedMatches(cur, cfg) {
			return st, nil
		}
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("stream %q: %w", FeedStream, err)
	}
	st, err = js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create stream %q: %w", FeedStream, err)
	}
	// The server sets the source up in the background; the revisions
	// written until then are still in StatusBucket, and are sourced then.
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		info, err := st.Info(ctx)
		if err == nil && len(info.Sources) == 1 && info.Sources[0].Active >= 0 {
			return st, nil
		}
		select {
		case <-ctx.Done():
			if err == nil && len(info.Sources) == 1 && info.Sources[0].Error != nil {
				err = info.Sources[0].Error
			}
			return nil, fmt.Errorf("stream %q does not source %s: %w", FeedStream, StreamName(StatusBucket), errors.Join(ctx.Err(), err))
		case <-t.C:
		}
	}
}

func feedMatches(got, want jetstream.StreamConfig) bool {
	return got.MaxAge == want.MaxAge && got.Replicas == want.Replicas &&
		got.MaxMsgsPerSubject <= 0 && len(got.Sources) == 1 && got.Sources[0].Name == want.Sources[0].Name
}

// Feed returns FeedStream, or ErrFeedNotFound when it does not exist.
func Feed(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, FeedStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, ErrFeedNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("stream %q: %w", FeedStream, err)
	}
	return st, nil
}

// streamSourceHeader is the header nats-server adds to a sourced message.
const streamSourceHeader = "Nats-Stream-Source"

// FeedRevision returns the StatusBucket revision a FeedStream message was
// sourced from, which its Nats-Stream-Source header holds: "<stream>
// <sequence> <filter> <transform> <subject>". It reports false when the
// header is missing or names another stream.
func FeedRevision(h nats.Header) (uint64, bool) {
	fields := strings.Fields(h.Get(streamSourceHeader))
	if len(fields) < 2 || fields[0] != StreamName(StatusBucket) {
		return 0, false
	}
	rev, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil || rev == 0 {
		return 0, false
	}
	return rev, true
}

// EnsureWebhooks creates, or brings up to date, what the webhooks
// processes use besides greendot's buckets: FeedStream (as EnsureFeed
// does, with maxAge) and WebhookResyncBucket. `greendot buckets --feed`
// runs it. It is idempotent.
func EnsureWebhooks(ctx context.Context, js jetstream.JetStream, o BucketOptions, maxAge time.Duration) error {
	if _, err := EnsureFeed(ctx, js, o, maxAge); err != nil {
		return err
	}
	_, err := EnsureBucket(ctx, js, WebhookResyncBucket, o)
	return err
}
