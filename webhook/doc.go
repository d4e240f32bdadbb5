// Package webhook delivers users' presence transitions to an app's
// backend over HTTP: the `greendot webhooks` process.
//
// A Service consumes every revision of presence_status through a durable
// consumer of its own (Config.Consumer), so a process that stops resumes
// where it stopped. It reads them from the stream presence_feed
// (presence.FeedStream), which sources presence_status and keeps every
// revision for its max age (72h by default), where the bucket keeps only
// the last 10 per user: a receiver that is down for less than the max age
// loses no transition. The stream must exist (`greendot buckets --feed`);
// Run refuses to start without it. An event's Rev is still the
// presence_status revision. A revision that changes what a backend sees of the
// user (status, devices, last_seen or custom status) becomes an Event; events are POSTed
// in batches (a JSON Batch) of up to BatchSize, sent once the first has
// waited BatchWait. Each POST is signed: the Greendot-Signature header is
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">", which Verify
// checks, refusing a timestamp too far from now against replays.
//
// A batch is acknowledged only once the endpoint answers 2xx. Until then
// it is retried with exponential backoff (a 429 or 503's Retry-After is
// honoured, up to MaxBackoff) at most RateLimit POSTs a second. A batch refused for good
// (4xx other than 408 and 429), or still failing after GiveUpAfter, is
// dead-lettered: counted, logged with its users and revisions, and never
// sent again. So that the endpoint does not keep those users as the dead
// letter found them, the process remembers them (up to a bound, and in
// the bucket presence_webhook_resync, where the next process takes them
// over) and once the endpoint takes deliveries again sends each one's
// current record, read from presence_status, at its current revision (see
// resync.go).
//
// Order: the consumer hands out at most BatchSize revisions before they
// are acknowledged (MaxAckPending), and is pinned to one process at a time
// (a priority group with a pinned client), so a batch is sent only after
// the one before it was delivered or given up, and a user's events arrive
// in the order of their revisions. Several processes may run for
// availability: one serves, and another takes over when it stops pulling
// (at once when it stops cleanly, after PinnedTTL when it dies). What a
// process that died held comes back only after AckWait: the one that took
// over holds the newer revisions back until then (it sees them pending in
// the consumer's info), and sends it first.
// Delivery is at least once: a batch whose 2xx was lost is sent again,
// and every event carries its revision, so a receiver drops what is not
// newer than what it has. A user's current state sent after a dead letter
// may come before older events of the user still on their way; the
// receiver drops those the same way.
package webhook
