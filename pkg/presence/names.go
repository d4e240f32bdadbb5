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
	// RoomsBucket holds one key per connection in a room,
	// "<room token>.<gateway>.<epoch>.<user>.<conn>" (RoomMember.Key),
	// value a RoomValue: written when the connection joins the room or
	// changes its meta there, deleted when it leaves. Like ConnsBucket's
	// keys, they have no TTL: the lease they are written under keeps them,
	// and its end removes them.
	RoomsBucket = "presence_rooms"
)

// FeedStream is the optional stream the webhooks processes consume: it
// sources StatusBucket's stream, keeping each revision on its subject
// ("$KV.presence_status.<user>") for FeedOptions.MaxAge, however many a
// user makes, where StatusBucket keeps StatusHistory per user. Its
// messages carry their StatusBucket revision in the Nats-Stream-Source
// header (FeedRevision).
const FeedStream = "presence_feed"

// WebhookResyncBucket is the optional bucket where the webhooks processes
// keep the users of their dead letters whose current state is still to be
// sent: one key per consumer and user, "<consumer>.<user>" (ResyncKey),
// its value the newest revision of the user dead-lettered
// ({"rev":4017}), its time that of the user's last dead letter. A key is
// written when a batch with its user is dead-lettered, and purged once
// the user's current state went through or was given up; a process
// reads its consumer's keys when it starts and when it is handed the
// consumer, so that no user is forgotten when a process stops or dies.
const WebhookResyncBucket = "presence_webhook_resync"

// ResyncKey returns the WebhookResyncBucket key of a user of a dead
// letter of consumer's; ResyncKey(consumer, ">") is the filter of all of
// consumer's.
func ResyncKey(consumer, userID string) string { return consumer + "." + userID }

// Durable consumer names, on the streams behind the buckets ("KV_" + bucket).
const (
	// ReaperConsumer is the durable consumer on LeasesBucket's stream (and
	// one of the same name on ConnsBucket's, for keys of the earlier shape)
	// that all reaper instances share.
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
	// PublishedSubject carries the writers' reports of the events they
	// published (Published), which the fanouts read.
	PublishedSubject = "presence.published"

	roomPrefix = "presence.room."
	// RoomWildcard matches every room subject: events, signals and
	// RoomLeaseEndedSubject.
	RoomWildcard = "presence.room.>"
	// RoomLeaseEndedSubject carries a RoomLeaseEnded when a reaper has
	// ended a lease's room memberships: every gateway drops the members
	// held under it. It is why LeaseEndedRoom is not a valid room id.
	RoomLeaseEndedSubject = roomPrefix + LeaseEndedRoom

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

// RoomSubject returns the subject of a room's events (RoomEvent): the
// writer of a room key publishes one right after the write, and gateways
// with local members of the room subscribe to it.
func RoomSubject(roomID string) string { return roomPrefix + RoomToken(roomID) }

// RoomSignalSubject returns the subject of a room's signals (typing and
// the like), which are never stored.
func RoomSignalSubject(roomID string) string { return RoomSubject(roomID) + ".signal" }

// RoomToken returns the KV key and subject token of a room: its id with
// every ':' (which KV keys cannot hold) replaced by '=' (which room ids
// cannot hold), so that it maps back (RoomIDOf).
func RoomToken(roomID string) string { return strings.ReplaceAll(roomID, ":", "=") }

// RoomIDOf returns the room id of a token made by RoomToken. It reports
// false for a token that is not one.
func RoomIDOf(token string) (string, bool) {
	id := strings.ReplaceAll(token, "=", ":")
	return id, ValidRoomID(id)
}

// RoomMember is one connection in a room, as its key in RoomsBucket
// names it.
type RoomMember struct {
	Room, Gateway, Epoch, UserID, ConnID string
}

// Key returns the member's RoomsBucket key:
// "<room token>.<gateway>.<epoch>.<user>.<conn>".
func (m RoomMember) Key() string {
	return RoomToken(m.Room) + "." + m.Gateway + "." + m.Epoch + "." + m.UserID + "." + m.ConnID
}

// ParseRoomKey parses a RoomsBucket key. It reports false for any other
// key.
func ParseRoomKey(key string) (RoomMember, bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 5 || !ValidToken(parts[1]) || !ValidToken(parts[2]) || !ValidUserID(parts[3]) || !ValidToken(parts[4]) {
		return RoomMember{}, false
	}
	room, ok := RoomIDOf(parts[0])
	if !ok {
		return RoomMember{}, false
	}
	return RoomMember{Room: room, Gateway: parts[1], Epoch: parts[2], UserID: parts[3], ConnID: parts[4]}, true
}

// RoomKeysFilter returns the RoomsBucket key filter matching every member
// of a room.
func RoomKeysFilter(roomID string) string { return RoomToken(roomID) + ".>" }

// LeaseRoomKeysFilter returns the RoomsBucket key filter matching every
// room key written under one lease.
func LeaseRoomKeysFilter(gatewayID, epoch string) string {
	return "*." + gatewayID + "." + epoch + ".>"
}
