package presence

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
)

// NewPublisherEvery returns a Publisher that reports every d.
func NewPublisherEvery(nc *nats.Conn, d time.Duration) *Publisher {
	p := NewPublisher(nc)
	p.every = d
	return p
}

// Split divides a report into reports of at most most entries each.
func Split(rep Published, most int) []Published { return split(rep, most) }

// SetFeedWait sets how long s's status writes wait for FeedStream's copy.
func SetFeedWait(s *Store, d time.Duration) { s.feedWait = d }

// UnfedOf returns the unfed count of a stored status record.
func UnfedOf(data []byte) (int, error) {
	var r Record
	return decodeStored(data, &r, "")
}

// SetNow has s read the time from now.
func SetNow(s *Store, now func() time.Time) { s.now = now }

// FeedAbsentFor is how long a Store believes FeedStream missing once a
// look found it so.
const FeedAbsentFor = feedAbsentFor

// CachedCopy returns c's copy of the record and its unfed count, and
// whether the copy is kept decoded.
func CachedCopy(c *Cached) (Record, int, bool, error) {
	r, unfed, err := c.current("")
	return r, unfed, c.rec != nil, err
}

// FollowingBatch is FollowingAtMost in one batch of direct gets only, and
// reports whether NATS answered it.
func FollowingBatch(s *Store, ctx context.Context, a string, max int) ([]string, bool, bool, error) {
	return s.followsBatch(ctx, FollowingFilter(a), max, func(_, b string) string { return b })
}

// FollowingListed is Following by a listing of the keys only, the
// fallback of a batch NATS does not answer.
func FollowingListed(s *Store, ctx context.Context, a string) ([]string, error) {
	out, _, err := s.followsListed(ctx, FollowingFilter(a), 0, func(_, b string) string { return b })
	return out, err
}

// SetListStall sets how long s's listings wait, at first, for their
// watcher's next entry before they start again.
func SetListStall(s *Store, d time.Duration) { s.listStall = d }
