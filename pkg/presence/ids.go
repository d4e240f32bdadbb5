package presence

import "strings"

// MaxUserIDLen is the longest user id accepted.
const MaxUserIDLen = 64

// MaxDeviceLen is the longest device label accepted.
const MaxDeviceLen = 32

// ValidUserID reports whether s is a user id: 1 to 64 characters of
// A-Z a-z 0-9 _ -. User ids are KV key and subject tokens, so nothing else
// is allowed.
func ValidUserID(s string) bool {
	if len(s) == 0 || len(s) > MaxUserIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !idByte(s[i]) {
			return false
		}
	}
	return true
}

// ValidDevice reports whether s is a device label: 1 to 32 characters of
// A-Z a-z 0-9 _ - . and space.
func ValidDevice(s string) bool {
	if len(s) == 0 || len(s) > MaxDeviceLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !idByte(c) && c != '.' && c != ' ' {
			return false
		}
	}
	return true
}

// ValidToken reports whether s can be used as a NATS subject token and KV key
// token of greendot's own making (gateway and connection ids): 1 to 64
// characters of A-Z a-z 0-9 _ -.
func ValidToken(s string) bool { return ValidUserID(s) }

func idByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// MaxRoomIDLen is the longest room id accepted.
const MaxRoomIDLen = 128

// LeaseEndedRoom is the one id of the room id's form that is not a room:
// its subject is RoomLeaseEndedSubject.
const LeaseEndedRoom = "lease_ended"

// ValidRoomID reports whether s is a room id: 1 to 128 characters of
// A-Z a-z 0-9 _ - and ':', a namespace separator ("doc:42",
// "game:7:lobby"), other than LeaseEndedRoom.
func ValidRoomID(s string) bool {
	if len(s) == 0 || len(s) > MaxRoomIDLen || s == LeaseEndedRoom {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !idByte(s[i]) && s[i] != ':' {
			return false
		}
	}
	return true
}

// ValidRoomPattern reports whether s names rooms in a token's rooms claim:
// a room id, or a prefix of one ending in '*' ("doc:*"; "*" alone names
// every room).
func ValidRoomPattern(s string) bool {
	prefix, wild := strings.CutSuffix(s, "*")
	if !wild {
		return ValidRoomID(s)
	}
	return prefix == "" || ValidRoomID(prefix) || prefix == LeaseEndedRoom
}

// RoomPatternMatches reports whether a room pattern (ValidRoomPattern)
// names roomID.
func RoomPatternMatches(pattern, roomID string) bool {
	if prefix, wild := strings.CutSuffix(pattern, "*"); wild {
		return strings.HasPrefix(roomID, prefix)
	}
	return pattern == roomID
}
