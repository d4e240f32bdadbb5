package presence

import "time"

// SetFeedWait sets how long s's status writes wait for FeedStream's copy.
func SetFeedWait(s *Store, d time.Duration) { s.feedWait = d }
