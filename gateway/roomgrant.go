package gateway

import (
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// RoomsVerifier is a TokenVerifier that also reads a token's rooms claim:
// the rooms its subject may join, room ids and prefixes ending in '*'
// (nil when the token has none, which allows no room). pkg/auth's
// Verifier is one. With a TokenVerifier that is not one, a token allows
// no room.
type RoomsVerifier interface {
	TokenVerifier
	VerifyRooms(token string) (userID string, expires time.Time, rooms []string, err error)
}

// roomGrant says which rooms a connection may join: every room (dev
// auth), or those its token's rooms claim names. The zero value allows
// none. It is immutable; an auth renewal replaces it.
type roomGrant struct {
	all      bool
	patterns []string
}

// allRooms is the grant of an identity without a token (dev auth).
var allRooms = &roomGrant{all: true}

// newRoomGrant returns the grant of a token's rooms claim.
func newRoomGrant(patterns []string) *roomGrant { return &roomGrant{patterns: patterns} }

// allows reports whether the grant lets its holder join roomID.
func (g *roomGrant) allows(roomID string) bool {
	if g == nil {
		return false
	}
	if g.all {
		return true
	}
	for _, p := range g.patterns {
		if presence.RoomPatternMatches(p, roomID) {
			return true
		}
	}
	return false
}
