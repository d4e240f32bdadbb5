package presence

import "strings"

// Bucket names. They are part of the operator interface.
const (
	// ConnsBucket holds one key per live connection,
	// "<gateway>.<epoch>.<user>.<conn>" (LeaseConnKey), value a
	// ConnRecord: created when the connection starts, rewritten when it
	// turns idle or active, removed when it ends. Its gateway's lease
	// (LeasesBucket) keeps it alive. Keys of the earlier shape,
	// "<user>.<conn>" (ConnKey), kept alive by per-key TTLs, are still
	// understood, so that a deployment can be upgraded in place.
	ConnsBucket = "presence_conns"
	// LeasesBucket holds one key per gateway lease, "<gateway>.<epoch>"
	// (LeaseKey), value a LeaseRecord, with a per-key TTL its gateway
	// refreshes about every second. Its expiry or deletion ends every
	// connection held under it.
	LeasesBucket = "presence_leases"
	// StatusBucket holds one key per user: "<user>", value a Record.
	StatusBucket = "presence_status"
	// GraphBucket holds the social graph and privacy settings:
	// "follows.<a>.<b>" (a follows b; any value) and "settings.<user>" (a
	// Settings value).
	GraphBucket = "presence_graph"
)

// FeedStream is the optional stream the webhooks processes consume: it
// sources StatusBucket's stream, keeping each revision on its subject
// ("$KV.presence_status.<user>") for FeedOptions.MaxAge, however many a
// user makes, where StatusBucket keeps StatusHistory per user. Its
// messages carry their StatusBucket revision in the Nats-Stream-Source
// header (FeedRevision).
const FeedStream = "presence_feed"

// Durable consumer names, on the streams behind the buckets ("KV_" + bucket).
const (
	// ReaperConsumer is the durable consumer on ConnsBucket's stream that all
	// reaper instances share.
	ReaperConsumer = "reaper"
	// FanoutConsumer is the durable consumer on StatusBucket's stream that all
	// fanout instances share.
	FanoutConsumer = "fanout"
	// WebhooksConsumer is the default durable consumer on FeedStream of
	// the webhooks processes that serve one endpoint; each
	// endpoint has a consumer of its own.
	WebhooksConsumer = "webhooks"
)

// Subject prefixes and tokens. Build subjects with the functions below.
const (
	eventPrefix   = "presence.event."
	gatewayPrefix = "presence.gw."
	// EventWildcard matches every public presence event.
	EventWildcard = "presence.event.*"
	// SelfWildcard matches every gateway's self events.
	SelfWildcard = "presence.gw.*.self"

	followsPrefix  = "follows."
	settingsPrefix = "settings."
)

// StreamName returns the name of the JetStream stream behind a KV bucket.
func StreamName(bucket string) string { return "KV_" + bucket }

// KeySubject returns the subject a KV key is stored on.
func KeySubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// ConnKey returns the key of a connection in ConnsBucket in the earlier
// shape, "<user>.<conn>", kept alive by its own TTL.
func ConnKey(userID, connID string) string { return userID + "." + connID }

// ConnKeyFilter returns the key filter matching all connections of a user
// in the earlier shape.
func ConnKeyFilter(userID string) string { return userID + ".*" }

// LegacyConnsFilter matches every key of the earlier shape (two tokens);
// keys held under a lease have four.
const LegacyConnsFilter = "*.*"

// SplitConnKey splits a ConnsBucket key of the earlier shape into user and
// connection ids. It reports false for a key of any other shape.
func SplitConnKey(key string) (userID, connID string, ok bool) {
	userID, connID, ok = strings.Cut(key, ".")
	if !ok || !ValidUserID(userID) || connID == "" || strings.Contains(connID, ".") {
		return "", "", false
	}
	return userID, connID, true
}

// LeaseKey returns the key of a gateway's lease in LeasesBucket: the
// gateway's id and the epoch of this lease, a token the gateway makes new
// each time it takes a lease.
func LeaseKey(gatewayID, epoch string) string { return gatewayID + "." + epoch }

// ParseLeaseKey parses a LeasesBucket key. It reports false for any other
// key.
func ParseLeaseKey(key string) (gatewayID, epoch string, ok bool) {
	gatewayID, epoch, ok = strings.Cut(key, ".")
	if !ok || !ValidToken(gatewayID) || !ValidToken(epoch) {
		return "", "", false
	}
	return gatewayID, epoch, true
}

// LeaseConnKey returns the ConnsBucket key of a connection held under a
// gateway's lease: "<gateway>.<epoch>.<user>.<conn>". One lease's keys are
// listed, or purged, with LeaseConnsFilter.
func LeaseConnKey(gatewayID, epoch, userID, connID string) string {
	return gatewayID + "." + epoch + "." + userID + "." + connID
}

// LeaseConnsFilter returns the key filter matching every connection held
// under one lease.
func LeaseConnsFilter(gatewayID, epoch string) string { return gatewayID + "." + epoch + ".>" }

// UserConnsFilter returns the key filter matching every connection of a
// user held under any lease.
func UserConnsFilter(userID string) string { return "*.*." + userID + ".*" }

// ParseLeaseConnKey parses a ConnsBucket key held under a lease. It
// reports false for a key of any other shape.
func ParseLeaseConnKey(key string) (gatewayID, epoch, userID, connID string, ok bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 4 || !ValidToken(parts[0]) || !ValidToken(parts[1]) || !ValidUserID(parts[2]) || !ValidToken(parts[3]) {
		return "", "", "", "", false
	}
	return parts[0], parts[1], parts[2], parts[3], true
}

// StatusKey returns the key of a user in StatusBucket.
func StatusKey(userID string) string { return userID }

// FollowKey returns the GraphBucket key that says a follows b.
func FollowKey(a, b string) string { return followsPrefix + a + "." + b }

// FollowingFilter returns the GraphBucket key filter matching everyone a
// follows.
func FollowingFilter(a string) string { return followsPrefix + a + ".*" }

// FollowersFilter returns the GraphBucket key filter matching everyone who
// follows b.
func FollowersFilter(b string) string { return followsPrefix + "*." + b }

// ParseFollowKey parses a GraphBucket follow key. It reports false for any
// other key.
func ParseFollowKey(key string) (a, b string, ok bool) {
	rest, ok := strings.CutPrefix(key, followsPrefix)
	if !ok {
		return "", "", false
	}
	a, b, ok = strings.Cut(rest, ".")
	if !ok || !ValidUserID(a) || !ValidUserID(b) {
		return "", "", false
	}
	return a, b, true
}

// SettingsKey returns the GraphBucket key of a user's privacy settings.
func SettingsKey(userID string) string { return settingsPrefix + userID }

// ParseSettingsKey parses a GraphBucket settings key. It reports false for
// any other key.
func ParseSettingsKey(key string) (userID string, ok bool) {
	userID, ok = strings.CutPrefix(key, settingsPrefix)
	return userID, ok && ValidUserID(userID)
}

// EventSubject returns the subject of a user's public presence events: the
// fanout publishes an Event there whenever what others see of the user
// changes. Gateways subscribe to it for users their sockets watch.
func EventSubject(userID string) string { return eventPrefix + userID }

// SelfSubject returns the subject on which a gateway receives SelfEvents for
// the users connected to it. One subject per gateway (not per user) keeps a
// gateway's NATS subscriptions independent of how many users it holds.
func SelfSubject(gatewayID string) string { return gatewayPrefix + gatewayID + ".self" }
