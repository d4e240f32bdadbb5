package presence

import "strings"

// Bucket names. They are part of the operator interface.
const (
	// ConnsBucket holds one key per live connection: "<user>.<conn>", value
	// a ConnRecord, with a per-key TTL refreshed by heartbeats.
	ConnsBucket = "presence_conns"
	// StatusBucket holds one key per user: "<user>", value a Record.
	StatusBucket = "presence_status"
	// GraphBucket holds the social graph and privacy settings:
	// "follows.<a>.<b>" (a follows b; any value) and "settings.<user>" (a
	// Settings value).
	GraphBucket = "presence_graph"
)

// Durable consumer names, on the streams behind the buckets ("KV_" + bucket).
const (
	// ReaperConsumer is the durable consumer on ConnsBucket's stream that all
	// reaper instances share.
	ReaperConsumer = "reaper"
	// FanoutConsumer is the durable consumer on StatusBucket's stream that all
	// fanout instances share.
	FanoutConsumer = "fanout"
)

// Subject prefixes and tokens. Build subjects with the functions below.
const (
	eventPrefix   = "presence.event."
	gatewayPrefix = "presence.gw."
	// EventWildcard matches every public presence event.
	EventWildcard = "presence.event.*"

	followsPrefix  = "follows."
	settingsPrefix = "settings."
)

// StreamName returns the name of the JetStream stream behind a KV bucket.
func StreamName(bucket string) string { return "KV_" + bucket }

// KeySubject returns the subject a KV key is stored on.
func KeySubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// ConnKey returns the key of a connection in ConnsBucket.
func ConnKey(userID, connID string) string { return userID + "." + connID }

// ConnKeyFilter returns the key filter matching all connections of a user.
func ConnKeyFilter(userID string) string { return userID + ".*" }

// SplitConnKey splits a ConnsBucket key into user and connection ids. It
// reports false for a key of any other shape.
func SplitConnKey(key string) (userID, connID string, ok bool) {
	userID, connID, ok = strings.Cut(key, ".")
	if !ok || !ValidUserID(userID) || connID == "" || strings.Contains(connID, ".") {
		return "", "", false
	}
	return userID, connID, true
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

// UserFromEventSubject returns the user id of an EventSubject.
func UserFromEventSubject(subject string) (string, bool) {
	u, ok := strings.CutPrefix(subject, eventPrefix)
	return u, ok && ValidUserID(u)
}

// SelfSubject returns the subject on which a gateway receives SelfEvents for
// the users connected to it. One subject per gateway (not per user) keeps a
// gateway's NATS subscriptions independent of how many users it holds.
func SelfSubject(gatewayID string) string { return gatewayPrefix + gatewayID + ".self" }
