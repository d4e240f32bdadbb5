package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/pkg/presence"
)

// MinSecretLen is the shortest HMAC secret New accepts, in bytes: RFC 7518
// asks for a key at least as long as the hash output (256 bits for HS256).
const MinSecretLen = 32

// MaxTokenLen is the longest token Verify decodes, in bytes. Anything longer
// is refused as malformed before any parsing.
const MaxTokenLen = 8192

// MaxLeeway is the largest clock-skew allowance New accepts.
const MaxLeeway = 5 * time.Minute

// Config configures a Verifier. Exactly one of Secret, PublicKey and Keys
// must be set.
type Config struct {
	// Secret is the HMAC secret of HS256, HS384 and HS512 tokens, at least
	// MinSecretLen bytes. The Verifier keeps a copy.
	Secret []byte
	// PublicKey is the contents of a PEM file holding one public key: a
	// PKIX "PUBLIC KEY", a PKCS #1 "RSA PUBLIC KEY" or an X.509
	// "CERTIFICATE" (only its key is used; its validity period and chain
	// are not checked). RSA keys (at least 2048 bits) verify RS256, RS384,
	// RS512, PS256, PS384 and PS512; ECDSA keys the ES algorithm of their
	// curve (P-256: ES256, P-384: ES384, P-521: ES512); Ed25519 keys
	// EdDSA. A private key is refused: the gateway never needs one.
	PublicKey []byte
	// Keys is a set of keys, read from a JWK Set and read again as it
	// changes (NewKeySet), of which each token's kid header names the one
	// that signed it. A token without a kid is checked against the keys
	// that take its algorithm, when there are at most MaxKeysWithoutKID.
	Keys *KeySet
	// Issuer, when not empty, is the iss claim every token must carry.
	Issuer string
	// Audience, when not empty, is a value the aud claim of every token
	// must contain.
	Audience string
	// Leeway is how much clock skew is forgiven when checking exp, nbf and
	// iat; zero means none. At most MaxLeeway.
	Leeway time.Duration
	// Now returns the current time; nil means time.Now. Tests may replace
	// it.
	Now func() time.Time
}

// Verifier verifies JWTs with one key, or with the keys of a KeySet. It is
// safe for concurrent use.
type Verifier struct {
	key    any
	kind   keyKind
	algs   []string
	keys   *KeySet
	leeway time.Duration
	issuer string
	aud    string
	parser *jwt.Parser
}

// New checks cfg, parses its key and returns a Verifier. Every error wraps
// ErrInvalidConfig.
func New(cfg Config) (*Verifier, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	given := 0
	for _, set := range []bool{len(cfg.Secret) > 0, len(cfg.PublicKey) > 0, cfg.Keys != nil} {
		if set {
			given++
		}
	}
	switch {
	case given > 1:
		return nil, bad("give one of an HMAC secret, a public key and a key set")
	case given == 0:
		return nil, bad("no key: give an HMAC secret, a PEM public key or a key set")
	case len(cfg.Secret) > 0 && len(cfg.Secret) < MinSecretLen:
		return nil, bad("HMAC secret is %d bytes: want at least %d", len(cfg.Secret), MinSecretLen)
	case cfg.Leeway < 0 || cfg.Leeway > MaxLeeway:
		return nil, bad("leeway %v: want 0 to %v", cfg.Leeway, MaxLeeway)
	}
	v := &Verifier{leeway: cfg.Leeway, issuer: cfg.Issuer, aud: cfg.Audience, keys: cfg.Keys}
	switch {
	case cfg.Keys != nil:
	case len(cfg.Secret) > 0:
		v.key, v.kind = slices.Clone(cfg.Secret), kindHMAC
	default:
		key, kind, err := parsePublicKey(cfg.PublicKey)
		if err != nil {
			return nil, bad("public key: %v", err)
		}
		v.key, v.kind = key, kind
	}
	if v.keys == nil {
		v.algs = v.kind.algorithms(v.key)
	}

	opts := []jwt.ParserOption{
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(cfg.Leeway),
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	if cfg.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(cfg.Now))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// Algorithms returns the signing algorithms the Verifier accepts (with a
// key set, those of the keys it read last).
func (v *Verifier) Algorithms() []string {
	if v.keys != nil {
		return v.keys.algorithms()
	}
	return slices.Clone(v.algs)
}

// KeyKind describes the configured key: "HMAC secret", "RSA public key",
// "ECDSA public key", "Ed25519 public key" or "key set".
func (v *Verifier) KeyKind() string {
	if v.keys != nil {
		return "key set"
	}
	return v.kind.String()
}

// RefreshKeys reads the Verifier's key set again every KeySetConfig.Refresh
// until ctx ends; without a key set it returns at once. The gateway runs
// it for as long as it serves.
func (v *Verifier) RefreshKeys(ctx context.Context) {
	if v.keys != nil {
		v.keys.Run(ctx)
	}
}

// WaitsForKeys reports whether verifying token may first wait for the
// key set to be read again: the token's kid header names a key the set
// lacks. Such a read takes up to KeySetConfig.Timeout; a caller that must
// not wait that long verifies the token elsewhere. It is false without a
// key set, and for a token that is not a JWT (which Verify refuses at
// once).
func (v *Verifier) WaitsForKeys(token string) bool {
	if v.keys == nil || len(token) > MaxTokenLen {
		return false
	}
	t, _, err := v.parser.ParseUnverified(token, &jwt.RegisteredClaims{})
	if err != nil {
		return false
	}
	kid, ok := t.Header["kid"].(string)
	return ok && kid != "" && !v.keys.has(kid)
}

// Verify checks a token's signature and claims, and returns the user id its
// sub claim names and when it stops being accepted (its exp claim plus the
// leeway). Every error wraps one of the sentinels of this package.
func (v *Verifier) Verify(token string) (userID string, expires time.Time, err error) {
	var claims jwt.RegisteredClaims
	if err := v.parse(token, &claims, &claims); err != nil {
		return "", time.Time{}, err
	}
	return claims.Subject, claims.ExpiresAt.Add(v.leeway), nil
}

// watchClaims are the registered claims and the watch claim.
type watchClaims struct {
	jwt.RegisteredClaims
	Watch json.RawMessage `json:"watch"`
}

// VerifyWatch is Verify that also returns the token's watch claim: the
// user ids its subject may watch, signed by the app, without duplicates.
// It is nil when the token has no watch claim (or a null one). A claim
// that is not a list of valid user ids fails with ErrWatchClaim.
func (v *Verifier) VerifyWatch(token string) (userID string, expires time.Time, watch []string, err error) {
	var claims watchClaims
	if err := v.parse(token, &claims, &claims.RegisteredClaims); err != nil {
		return "", time.Time{}, nil, err
	}
	watch, err = ParseWatchClaim(claims.Watch)
	if err != nil {
		return "", time.Time{}, nil, err
	}
	return claims.Subject, claims.ExpiresAt.Add(v.leeway), watch, nil
}

// roomsClaims are the registered claims and the rooms claim.
type roomsClaims struct {
	jwt.RegisteredClaims
	Rooms json.RawMessage `json:"rooms"`
}

// VerifyRooms is Verify that also returns the token's rooms claim: the
// rooms its subject may join, each a room id ("doc:42") or a prefix
// ending in '*' ("doc:*", or "*" for every room). It is nil when the token
// has no rooms claim (or a null one): such a token allows no room. A claim
// that is not a list of those fails with ErrRoomsClaim.
func (v *Verifier) VerifyRooms(token string) (userID string, expires time.Time, rooms []string, err error) {
	var claims roomsClaims
	if err := v.parse(token, &claims, &claims.RegisteredClaims); err != nil {
		return "", time.Time{}, nil, err
	}
	rooms, err = ParseRoomsClaim(claims.Rooms)
	if err != nil {
		return "", time.Time{}, nil, err
	}
	return claims.Subject, claims.ExpiresAt.Add(v.leeway), rooms, nil
}

// ParseWatchClaim reads a watch claim, as VerifyWatch does: a list of
// valid user ids, returned without duplicates; nil for an absent (empty)
// or null claim. Anything else fails with ErrWatchClaim.
func ParseWatchClaim(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var watch []string
	if err := json.Unmarshal(raw, &watch); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrWatchClaim, err)
	}
	ids := make([]string, 0, len(watch))
	seen := make(map[string]bool, len(watch))
	for _, u := range watch {
		if !presence.ValidUserID(u) {
			return nil, fmt.Errorf("%w: %q is not 1 to %d characters of A-Z a-z 0-9 _ -", ErrWatchClaim, u, presence.MaxUserIDLen)
		}
		if !seen[u] {
			seen[u] = true
			ids = append(ids, u)
		}
	}
	return ids, nil
}

// ParseRoomsClaim reads a rooms claim, as VerifyRooms does: a list of
// room ids and prefixes ending in '*' (an empty list for []); nil for an
// absent (empty) or null claim, which allows no room. Anything else fails
// with ErrRoomsClaim.
func ParseRoomsClaim(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var rooms []string
	if err := json.Unmarshal(raw, &rooms); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRoomsClaim, err)
	}
	if rooms == nil {
		rooms = []string{}
	}
	for _, r := range rooms {
		if !presence.ValidRoomPattern(r) {
			return nil, fmt.Errorf("%w: %q", ErrRoomsClaim, r)
		}
	}
	return rooms, nil
}

// parse checks a token's length, signature and claims into claims, whose
// registered part is reg.
func (v *Verifier) parse(token string, claims jwt.Claims, reg *jwt.RegisteredClaims) error {
	if len(token) > MaxTokenLen {
		return fmt.Errorf("%w: longer than %d bytes", ErrMalformed, MaxTokenLen)
	}
	if _, err := v.parser.ParseWithClaims(token, claims, v.keyFunc); err != nil {
		return v.explain(err, reg)
	}
	switch {
	case reg.Subject == "":
		return ErrNoSubject
	case !presence.ValidUserID(reg.Subject):
		return fmt.Errorf("%w: want 1 to %d characters of A-Z a-z 0-9 _ -", ErrBadSubject, presence.MaxUserIDLen)
	}
	return nil
}

// keyFunc hands the key to the parser only for a token signed with one of
// the key's algorithms, by a signing method of the key's kind; with a key
// set, the keys its kid names (or, without one, that take its algorithm).
func (v *Verifier) keyFunc(t *jwt.Token) (any, error) {
	if v.keys != nil {
		kid, ok := t.Header["kid"].(string)
		if _, given := t.Header["kid"]; given && !ok {
			return nil, &keyError{fmt.Sprintf("%s: the kid header is not a string", ErrUnknownKey)}
		}
		return v.keys.lookup(kid, t.Method)
	}
	alg := t.Method.Alg()
	if !slices.Contains(v.algs, alg) || !v.kind.matches(t.Method) {
		return nil, &algError{fmt.Sprintf("%s: %q (this %s accepts %s)", ErrAlgorithm, alg, v.kind, strings.Join(v.algs, ", "))}
	}
	return v.key, nil
}

// algError is keyFunc's refusal of an algorithm. It wraps ErrAlgorithm.
type algError struct{ msg string }

func (e *algError) Error() string { return e.msg }
func (e *algError) Unwrap() error { return ErrAlgorithm }

// explain turns a jwt/v5 error into one of this package's errors. Problems
// are reported in the order a client can fix them: the token's form, its
// signature, then its claims.
func (v *Verifier) explain(err error, claims *jwt.RegisteredClaims) error {
	var (
		ae *algError
		ke *keyError
	)
	switch {
	case errors.As(err, &ae):
		// keyFunc's own error, wrapped by the parser.
		return ae
	case errors.As(err, &ke):
		return ke
	case errors.Is(err, jwt.ErrTokenMalformed):
		return fmt.Errorf("%w: %s", ErrMalformed, detail(err, jwt.ErrTokenMalformed))
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		// ParseUnverified found no signing method for the alg header.
		return fmt.Errorf("%w: unknown algorithm (this %s accepts %s)", ErrAlgorithm, v.KeyKind(), strings.Join(v.Algorithms(), ", "))
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return ErrBadSignature
	case claims.ExpiresAt == nil:
		return ErrNoExpiry
	case errors.Is(err, jwt.ErrTokenExpired):
		return fmt.Errorf("%w at %s", ErrExpired, claims.ExpiresAt.UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return ErrNotYetValid
	case v.issuer != "" && claims.Issuer != v.issuer:
		if claims.Issuer == "" {
			return fmt.Errorf("%w: token has no iss claim", ErrIssuer)
		}
		return fmt.Errorf("%w: %q", ErrIssuer, claims.Issuer)
	case v.aud != "" && !slices.Contains(claims.Audience, v.aud):
		if len(claims.Audience) == 0 {
			return fmt.Errorf("%w: token has no aud claim", ErrAudience)
		}
		return fmt.Errorf("%w: %q", ErrAudience, []string(claims.Audience))
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		return fmt.Errorf("%w: %s", ErrMalformed, detail(err, jwt.ErrTokenInvalidClaims))
	}
	return fmt.Errorf("%w: %v", ErrMalformed, err)
}

// detail returns err's text without the prefix of the jwt sentinel it
// wraps, which this package's own sentinel replaces.
func detail(err, sentinel error) string {
	s := strings.TrimPrefix(err.Error(), sentinel.Error())
	s = strings.TrimLeft(s, ": ,")
	if s == "" {
		return sentinel.Error()
	}
	return s
}
