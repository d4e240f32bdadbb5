package presence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultMarkerTTL is how long ConnsBucket keeps the marker of a connection
// key that expired or was purged, unless BucketOptions says otherwise. A
// reaper that was down for less than this still sees every marker when it
// comes back; after longer, its periodic sweep catches up instead.
const DefaultMarkerTTL = time.Minute

// LeaseMarkerTTL is how long LeasesBucket keeps the marker of a lease that
// ended. A reaper that was down for less than this learns of every lease
// that ended meanwhile from its durable consumer; after longer, its
// start-up sweep finds what is left.
const LeaseMarkerTTL = 24 * time.Hour

// StatusHistory is how many revisions StatusBucket keeps per user, so that
// `nats kv history presence_status <user>` shows recent transitions.
const StatusHistory = 10

// BucketOptions says how the buckets are created. The zero value is right
// for a single NATS server.
type BucketOptions struct {
	// Replicas is the number of replicas of each bucket; zero means 1. Use 3
	// (or 5) in a NATS cluster.
	Replicas int
	// Storage is the storage type of new buckets; the zero value is file
	// storage. An existing bucket keeps the storage it was created with.
	Storage jetstream.StorageType
	// MarkerTTL is the LimitMarkerTTL of ConnsBucket, RoomsBucket and
	// WebhookResyncBucket; zero means DefaultMarkerTTL. At least one
	// second.
	MarkerTTL time.Duration
}

func (o BucketOptions) replicas() int {
	if o.Replicas <= 0 {
		return 1
	}
	return o.Replicas
}

func (o BucketOptions) markerTTL() time.Duration {
	if o.MarkerTTL <= 0 {
		return DefaultMarkerTTL
	}
	return o.MarkerTTL
}

// Validate reports whether o is usable.
func (o BucketOptions) Validate() error {
	if o.Replicas < 0 || o.Replicas > 5 {
		return fmt.Errorf("replicas %d: want 1 to 5", o.Replicas)
	}
	if o.MarkerTTL != 0 && o.MarkerTTL < time.Second {
		return fmt.Errorf("marker TTL %v: want at least 1s", o.MarkerTTL)
	}
	return nil
}

// BucketConfig returns the configuration greendot wants for one of its
// buckets.
func BucketConfig(bucket string, o BucketOptions) (jetstream.KeyValueConfig, error) {
	cfg := jetstream.KeyValueConfig{
		Bucket:   bucket,
		History:  1,
		Storage:  o.Storage,
		Replicas: o.replicas(),
	}
	switch bucket {
	case ConnsBucket:
		// History 1: with more, every TTL is raised to LimitMarkerTTL and an
		// older revision can come back silently when the newest one expires.
		// The marker TTL serves keys of the earlier shape, which expire.
		cfg.Description = "greendot: one key per live connection, <gateway>.<epoch>.<user>.<conn>, held under its gateway's lease"
		cfg.LimitMarkerTTL = o.markerTTL()
	case LeasesBucket:
		cfg.Description = "greendot: one key per gateway lease, <gateway>.<epoch>, refreshed every second; its end ends its connections"
		cfg.LimitMarkerTTL = LeaseMarkerTTL
	case StatusBucket:
		cfg.Description = "greendot: one record per user: chosen status, live connections, public view"
		cfg.History = StatusHistory
	case RoomsBucket:
		// History 1 and marker TTLs as for ConnsBucket: a member's delete
		// marker carries the marker TTL, so that keys that come and go
		// leave nothing behind.
		cfg.Description = "greendot: one key per connection in a room, <room>.<gateway>.<epoch>.<user>.<conn>, held under its gateway's lease"
		cfg.LimitMarkerTTL = o.markerTTL()
	case TimersBucket:
		// History 1, as for every key with a TTL; the markers of ended
		// timers stay for a day, for a reaper that was down.
		cfg.Description = "greendot: one key per deadline of a user's, custom.<user>, with a TTL that ends at it: the end clears the user's custom status"
		cfg.LimitMarkerTTL = TimersMarkerTTL
	case GraphBucket:
		cfg.Description = "greendot: follows.<a>.<b> edges and settings.<user> privacy settings"
	case WebhookResyncBucket:
		// A purged key's marker carries the marker TTL, as in RoomsBucket.
		cfg.Description = "greendot: one key per user of a webhook dead letter whose current state is still to be sent, <consumer>.<user>"
		cfg.LimitMarkerTTL = o.markerTTL()
	default:
		return cfg, fmt.Errorf("unknown bucket %q", bucket)
	}
	return cfg, nil
}

// EnsureBucket binds to a bucket, creating it or updating its configuration
// when it is missing or differs from what greendot wants. An update changes
// only what greendot sets (history, marker TTL, replicas, description): an
// existing bucket keeps its storage and whatever else its operator set
// (limits, compression, placement). It is idempotent and safe to run from
// many processes at once.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, bucket string, o BucketOptions) (jetstream.KeyValue, error) {
	kv, _, err := ensureBucket(ctx, js, bucket, o)
	return kv, err
}

// ensureBucket is EnsureBucket, and also returns the bucket's status when
// it looked at one (the bucket existed as greendot wants it); nil when it
// created or updated the bucket.
func ensureBucket(ctx context.Context, js jetstream.JetStream, bucket string, o BucketOptions) (jetstream.KeyValue, jetstream.KeyValueStatus, error) {
	cfg, err := BucketConfig(bucket, o)
	if err != nil {
		return nil, nil, err
	}
	kv, err := js.KeyValue(ctx, bucket)
	switch {
	case err == nil:
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("bucket %q status: %w", bucket, err)
		}
		if bucketMatches(st, cfg) {
			return kv, st, nil
		}
		if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			cur := s.Config()
			cur.Description, cur.History, cur.Replicas, cur.LimitMarkerTTL = cfg.Description, cfg.History, cfg.Replicas, cfg.LimitMarkerTTL
			cfg = cur
		}
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, nil, fmt.Errorf("bind bucket %q: %w", bucket, err)
	}
	kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("create bucket %q: %w", bucket, err)
	}
	return kv, nil, nil
}

// streamCreated returns when bucket's stream was created: from st, a
// status of the bucket, when it says; otherwise looked up.
func streamCreated(ctx context.Context, js jetstream.JetStream, bucket string, st jetstream.KeyValueStatus) (time.Time, error) {
	if s, ok := st.(*jetstream.KeyValueBucketStatus); ok && s.StreamInfo() != nil {
		return s.StreamInfo().Created, nil
	}
	stream, err := js.Stream(ctx, StreamName(bucket))
	if err != nil {
		return time.Time{}, fmt.Errorf("bucket %q: %w", bucket, err)
	}
	return stream.CachedInfo().Created, nil
}

func bucketMatches(st jetstream.KeyValueStatus, want jetstream.KeyValueConfig) bool {
	if st.History() != int64(want.History) || st.LimitMarkerTTL() != want.LimitMarkerTTL {
		return false
	}
	if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		return s.StreamInfo().Config.Replicas == want.Replicas
	}
	return true
}
