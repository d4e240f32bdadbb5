// Package presence is greendot's shared contract: the statuses a user can
// have, the records stored in JetStream KV, the public presence object, and
// every bucket, key, subject and consumer name the processes use.
//
// The gateway, reaper and fanout never import each other; they agree through
// this package. Names defined here are part of the operator interface (they
// are what `nats kv ls`, `nats kv watch` and `nats sub` show), so they are
// stable and documented in docs/architecture.md.
//
// A user's state lives in two buckets. ConnsBucket holds one key per
// WebSocket connection, "<user>.<conn>", whose per-key TTL is refreshed by
// heartbeats: the key disappearing (expiry, purge, or the end of the offline
// grace) is how a connection ends. StatusBucket holds one Record per user:
// the status the user chose, the set of their live connections, and the
// public view derived from both. Every write to a Record is a compare-and-set
// on its revision (see Store.UpdateStatus), so the set of connections in a
// Record is exact: a user is online exactly while that set is not empty.
package presence
