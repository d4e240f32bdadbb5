package auth

import "errors"

// ErrInvalidConfig wraps every configuration error of New.
var ErrInvalidConfig = errors.New("auth: invalid config")

// ErrMalformed means a token is not a well-formed JWT: wrong number of
// segments, bad base64, bad JSON, a claim of the wrong type, or too long.
var ErrMalformed = errors.New("malformed token")

// ErrAlgorithm means a token is signed with an algorithm the configured key
// cannot verify ("none", HS256 against a public key, RS256 against an
// ECDSA key, ...).
var ErrAlgorithm = errors.New("signing algorithm not accepted")

// ErrBadSignature means a token's signature does not verify with the
// configured key.
var ErrBadSignature = errors.New("bad signature")

// ErrExpired means a token's exp claim is in the past.
var ErrExpired = errors.New("token expired")

// ErrNoExpiry means a token has no exp claim.
var ErrNoExpiry = errors.New("token has no exp claim")

// ErrNotYetValid means a token's nbf or iat claim is in the future.
var ErrNotYetValid = errors.New("token not valid yet")

// ErrNoSubject means a token has no sub claim, or an empty one.
var ErrNoSubject = errors.New("token has no sub claim")

// ErrBadSubject means a token's sub claim is not a valid user id.
var ErrBadSubject = errors.New("token sub claim is not a valid user id")

// ErrIssuer means a token's iss claim is missing or not the configured
// issuer.
var ErrIssuer = errors.New("wrong token issuer")

// ErrAudience means a token's aud claim is missing or does not name the
// configured audience.
var ErrAudience = errors.New("wrong token audience")

// ErrWatchClaim means a token's watch claim is not a list of valid user
// ids.
var ErrWatchClaim = errors.New("token watch claim is not a list of user ids")

// ErrRoomsClaim means a token's rooms claim is not a list of room ids and
// room id prefixes ending in '*'.
var ErrRoomsClaim = errors.New("token rooms claim is not a list of room ids or prefixes ending in *")

// ErrUnknownKey means a token names (kid) a key the key set lacks, or
// names none where several keys of the set could have signed it.
var ErrUnknownKey = errors.New("unknown signing key")
