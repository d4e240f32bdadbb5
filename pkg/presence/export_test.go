package presence

import "time"

// SetFeedWait sets how long s's status writes wait for FeedStream's copy.
func SetFeedWait(s *Store, d time.Duration) { s.feedWait = d }

// UnfedOf returns the unfed count of a stored status record.
func UnfedOf(data []byte) (int, error) {
	var r Record
	return decodeStored(data, &r, "")
}
