package auth

import (
	"cmp"
	"context"
	"crypto"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/sync/singleflight"
)

// Bounds and defaults of a KeySet.
const (
	// MaxKeySetBytes is the largest JWK Set document read.
	MaxKeySetBytes = 1 << 20
	// MaxKeySetKeys is the most keys a JWK Set document may hold.
	MaxKeySetKeys = 64
	// MaxKeysWithoutKID is the most keys a token without a kid header is
	// checked against: with more that take its algorithm it must name
	// its key.
	MaxKeysWithoutKID = 4
	// DefaultKeyRefresh is how often a key set is read again.
	DefaultKeyRefresh = 10 * time.Minute
	// DefaultKeyMinRefresh is the least time between two reads asked for
	// by tokens whose kid the set lacks.
	DefaultKeyMinRefresh = 30 * time.Second
	// DefaultKeyTimeout bounds one read of a key set's URL.
	DefaultKeyTimeout = 5 * time.Second
)

// KeySetConfig configures a KeySet.
type KeySetConfig struct {
	// Source is where the JWK Set (RFC 7517) is read: the path of a file,
	// or an http:// or https:// URL (an identity provider's jwks_uri). A
	// file may hold HMAC secrets ("oct" keys); a set read from a URL is
	// published, and such keys and private keys in it are ignored.
	Source string
	// Refresh is how often the set is read again (Run); zero means
	// DefaultKeyRefresh.
	Refresh time.Duration
	// MinRefresh is the least time between two reads asked for by tokens
	// that name a kid the set lacks; zero means DefaultKeyMinRefresh.
	MinRefresh time.Duration
	// Timeout bounds one read; zero means DefaultKeyTimeout.
	Timeout time.Duration
	// Client reads a URL; nil means a client of the KeySet's own.
	Client *http.Client
	// Logger hears of every read that changes the set, of the keys a
	// read ignores, and of failed reads; nil discards.
	Logger *slog.Logger
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// A KeySet holds the verification keys of a JWK Set and reads them again
// every Refresh, and when a token names a kid it lacks (at most every
// MinRefresh), so that keys are rotated without a restart: publish the new
// key beside the old one, sign with it, and remove the old one once the
// tokens it signed have expired. A read that fails keeps the keys of the
// last good one. It is safe for concurrent use.
type KeySet struct {
	cfg   KeySetConfig
	url   bool
	keys  atomic.Pointer[[]setKey]
	reads singleflight.Group

	mu sync.Mutex
	// asked is when a token's unknown kid last had the set read.
	asked time.Time
	// asking, while that read runs, is closed when it ends.
	asking chan struct{}
}

// setKey is one usable key of a set.
type setKey struct {
	id   string
	key  any
	kind keyKind
	algs []string
}

// NewKeySet checks cfg and reads the set once: it fails when the source
// cannot be read or holds no usable key. Every error wraps
// ErrInvalidConfig.
func NewKeySet(ctx context.Context, cfg KeySetConfig) (*KeySet, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: key set %s: "+format, append([]any{ErrInvalidConfig, cfg.Source}, args...)...)
	}
	cfg.Refresh = cmp.Or(cfg.Refresh, DefaultKeyRefresh)
	cfg.MinRefresh = cmp.Or(cfg.MinRefresh, DefaultKeyMinRefresh)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultKeyTimeout)
	switch {
	case cfg.Source == "":
		return nil, fmt.Errorf("%w: key set: no source: give a file or an http(s) URL", ErrInvalidConfig)
	case cfg.Refresh < 0 || cfg.MinRefresh < 0 || cfg.Timeout < 0:
		return nil, bad("refresh, minimum refresh and timeout must not be negative")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ks := &KeySet{cfg: cfg, url: strings.HasPrefix(cfg.Source, "http://") || strings.HasPrefix(cfg.Source, "https://")}
	if ks.url && cfg.Client == nil {
		ks.cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if err := ks.Read(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return ks, nil
}

// Source is where the set is read.
func (ks *KeySet) Source() string { return ks.cfg.Source }

// IDs returns the kids of the keys read last, in the set's order (an empty
// string for a key without one).
func (ks *KeySet) IDs() []string {
	var ids []string
	for _, k := range *ks.keys.Load() {
		ids = append(ids, k.id)
	}
	return ids
}

// has reports whether the keys read last hold one whose kid is kid.
func (ks *KeySet) has(kid string) bool {
	return slices.ContainsFunc(*ks.keys.Load(), func(k setKey) bool { return k.id == kid })
}

// algorithms returns the algorithms the keys read last take.
func (ks *KeySet) algorithms() []string {
	var algs []string
	for _, k := range *ks.keys.Load() {
		for _, a := range k.algs {
			if !slices.Contains(algs, a) {
				algs = append(algs, a)
			}
		}
	}
	return algs
}

// Run reads the set every Refresh until ctx ends.
func (ks *KeySet) Run(ctx context.Context) {
	t := time.NewTicker(ks.cfg.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = ks.Read(ctx)
		}
	}
}

// Read reads the set now; reads at once share one. A read that fails, or
// finds no usable key, keeps the keys read before and is logged.
func (ks *KeySet) Read(ctx context.Context) error {
	_, err, _ := ks.reads.Do("", func() (any, error) {
		ctx, cancel := context.WithTimeout(ctx, ks.cfg.Timeout)
		defer cancel()
		keys, err := ks.read(ctx)
		old := ks.keys.Load()
		if err != nil {
			if old != nil {
				ks.cfg.Logger.Warn("jwt key set not read; keeping the keys read before", "source", ks.cfg.Source, "keys", len(*old), "err", err)
			}
			return nil, fmt.Errorf("key set %s: %w", ks.cfg.Source, err)
		}
		ks.keys.Store(&keys)
		if old == nil || !sameKeys(*old, keys) {
			ks.cfg.Logger.Info("jwt key set read", "source", ks.cfg.Source, "kids", strings.Join(ks.IDs(), ","))
		}
		return nil, nil
	})
	return err
}

func sameKeys(a, b []setKey) bool {
	return slices.EqualFunc(a, b, func(x, y setKey) bool {
		return x.id == y.id && x.kind == y.kind && slices.Equal(x.algs, y.algs) && keyEqual(x.key, y.key)
	})
}

// keyEqual reports whether two keys of a set are the same key.
func keyEqual(a, b any) bool {
	if s, ok := a.([]byte); ok {
		t, ok := b.([]byte)
		return ok && hmac.Equal(s, t)
	}
	pub, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(b)
}

// read reads and parses the source.
func (ks *KeySet) read(ctx context.Context) ([]setKey, error) {
	doc, err := ks.fetch(ctx)
	if err != nil {
		return nil, err
	}
	keys, ignored, err := parseKeySet(doc, ks.url)
	for _, why := range ignored {
		ks.cfg.Logger.Warn("jwt key set: a key is ignored", "source", ks.cfg.Source, "reason", why)
	}
	return keys, err
}

// fetch returns the document at the source.
func (ks *KeySet) fetch(ctx context.Context) ([]byte, error) {
	var r io.Reader
	if !ks.url {
		f, err := os.Open(ks.cfg.Source)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	} else {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ks.cfg.Source, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/jwk-set+json, application/json")
		resp, err := ks.cfg.Client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET answered %s", resp.Status)
		}
		r = resp.Body
	}
	doc, err := io.ReadAll(io.LimitReader(r, MaxKeySetBytes+1))
	if err != nil {
		return nil, err
	}
	if len(doc) > MaxKeySetBytes {
		return nil, fmt.Errorf("over %d bytes", MaxKeySetBytes)
	}
	return doc, nil
}

// jwkFields are the members of a JWK that decide whether it is used.
type jwkFields struct {
	Kid    string          `json:"kid"`
	Kty    string          `json:"kty"`
	Use    string          `json:"use"`
	Alg    string          `json:"alg"`
	KeyOps []string        `json:"key_ops"`
	D      json.RawMessage `json:"d"`
	K      json.RawMessage `json:"k"`
}

// parseKeySet reads a JWK Set document. Keys it cannot use (another use
// than sig, a kty or curve it does not know, a private key, a secret in a
// published set, a weak key) are left out, each with a reason; a
// document with none left is an error.
func parseKeySet(doc []byte, published bool) (keys []setKey, ignored []string, err error) {
	var set struct {
		Keys *[]json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(doc, &set); err != nil {
		return nil, nil, fmt.Errorf("not a JWK Set: %v", err)
	}
	switch {
	case set.Keys == nil:
		return nil, nil, errors.New(`not a JWK Set: no "keys" member`)
	case len(*set.Keys) > MaxKeySetKeys:
		return nil, nil, fmt.Errorf("%d keys: want at most %d", len(*set.Keys), MaxKeySetKeys)
	}
	for i, raw := range *set.Keys {
		k, err := parseJWK(raw, published)
		if err != nil {
			ignored = append(ignored, fmt.Sprintf("key %d: %v", i, err))
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		if len(ignored) > 0 {
			return nil, ignored, fmt.Errorf("no usable key (%s)", strings.Join(ignored, "; "))
		}
		return nil, nil, errors.New("no usable key: the set is empty")
	}
	return keys, ignored, nil
}

// parseJWK reads one key of a set.
func parseJWK(raw json.RawMessage, published bool) (setKey, error) {
	var f jwkFields
	if err := json.Unmarshal(raw, &f); err != nil {
		return setKey{}, err
	}
	name := "kid " + quoteKID(f.Kid)
	switch {
	case f.Use != "" && f.Use != "sig":
		return setKey{}, fmt.Errorf("%s: use %q, not sig", name, f.Use)
	case f.KeyOps != nil && !slices.Contains(f.KeyOps, "verify"):
		return setKey{}, fmt.Errorf("%s: key_ops %q lack verify", name, f.KeyOps)
	case f.D != nil:
		return setKey{}, fmt.Errorf("%s: a private key: give only its public part", name)
	case published && (f.Kty == "oct" || f.K != nil):
		return setKey{}, fmt.Errorf("%s: an HMAC secret, which a set read from a URL must not publish", name)
	}
	var jwk jose.JSONWebKey
	if err := jwk.UnmarshalJSON(raw); err != nil {
		if errors.Is(err, jose.ErrUnsupportedKeyType) {
			return setKey{}, fmt.Errorf("%s: kty %q (or its curve) not supported: want RSA, EC, OKP Ed25519 or oct", name, f.Kty)
		}
		return setKey{}, fmt.Errorf("%s: %v", name, strings.TrimPrefix(err.Error(), "go-jose/go-jose: "))
	}
	key, kind, err := classify(jwk.Key)
	if err != nil {
		return setKey{}, fmt.Errorf("%s: %v", name, err)
	}
	algs := kind.algorithms(key)
	if f.Alg != "" {
		if !slices.Contains(algs, f.Alg) {
			return setKey{}, fmt.Errorf("%s: alg %q does not fit a %s (%s)", name, f.Alg, kind, strings.Join(algs, ", "))
		}
		algs = []string{f.Alg}
	}
	return setKey{id: f.Kid, key: key, kind: kind, algs: algs}, nil
}

// lookup returns the keys that may have signed a token with the header
// kid (empty when it has none) and signing method m: one key, or a
// jwt.VerificationKeySet. A kid the set lacks has the set read again,
// unless a token did so within MinRefresh.
func (ks *KeySet) lookup(kid string, m jwt.SigningMethod) (any, error) {
	if kid != "" && !ks.has(kid) {
		ks.readForKID()
	}
	keys := *ks.keys.Load()
	var (
		found []jwt.VerificationKey
		named bool
		// takes are the algorithms of the keys kid names.
		takes []string
	)
	for _, k := range keys {
		if kid != "" {
			if k.id != kid {
				continue
			}
			takes = append(takes, k.algs...)
		}
		named = true
		if slices.Contains(k.algs, m.Alg()) && k.kind.matches(m) {
			found = append(found, k.key)
		}
	}
	switch {
	case kid != "" && !named:
		return nil, &keyError{fmt.Sprintf("%s: %q", ErrUnknownKey, kid)}
	case len(found) == 0 && kid != "":
		return nil, &algError{fmt.Sprintf("%s: %q (key %q takes %s)", ErrAlgorithm, m.Alg(), kid, strings.Join(takes, ", "))}
	case len(found) == 0:
		return nil, &algError{fmt.Sprintf("%s: %q (this key set takes %s)", ErrAlgorithm, m.Alg(), strings.Join(ks.algorithms(), ", "))}
	case len(found) == 1:
		return found[0], nil
	case kid == "" && len(found) > MaxKeysWithoutKID:
		return nil, &keyError{fmt.Sprintf("%s: %d keys of the set take %s: name the key with a kid header", ErrUnknownKey, len(found), m.Alg())}
	}
	return jwt.VerificationKeySet{Keys: found}, nil
}

// readForKID reads the set for a token whose kid it lacks, unless a
// token had it read within MinRefresh; while such a read runs, it waits
// for that one.
func (ks *KeySet) readForKID() {
	ks.mu.Lock()
	if ch := ks.asking; ch != nil {
		ks.mu.Unlock()
		<-ch
		return
	}
	now := ks.cfg.Now()
	if !ks.asked.IsZero() && now.Sub(ks.asked) < ks.cfg.MinRefresh {
		ks.mu.Unlock()
		return
	}
	ks.asked = now
	ch := make(chan struct{})
	ks.asking = ch
	ks.mu.Unlock()

	_ = ks.Read(context.Background())
	ks.mu.Lock()
	ks.asking = nil
	ks.mu.Unlock()
	close(ch)
}

// keyError is a refusal of a token's key: a kid the set lacks, or none
// where it must be given. It wraps ErrUnknownKey.
type keyError struct{ msg string }

func (e *keyError) Error() string { return e.msg }
func (e *keyError) Unwrap() error { return ErrUnknownKey }

// quoteKID names a kid in an error.
func quoteKID(s string) string {
	if s == "" {
		return "(none)"
	}
	return fmt.Sprintf("%q", s)
}
