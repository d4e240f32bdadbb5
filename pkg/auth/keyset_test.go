package auth_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/internal/syncbuf"
	"github.com/greendot/greendot/pkg/auth"
)

// jwk is one key of a JWK Set document.
func jwk(t *testing.T, kid string, key any, edit ...func(map[string]any)) map[string]any {
	t.Helper()
	data, err := json.Marshal(jose.JSONWebKey{Key: key, KeyID: kid})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, e := range edit {
		e(m)
	}
	return m
}

// jwks is a JWK Set document of keys.
func jwks(t *testing.T, keys ...map[string]any) []byte {
	t.Helper()
	if keys == nil {
		keys = []map[string]any{}
	}
	data, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// signKID signs claims for alice with key, naming kid (none when empty).
func signKID(t *testing.T, m jwt.SigningMethod, key any, kid string) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims())
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeClock is a clock the test moves.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(now.UnixNano())
	return c
}

func (c *fakeClock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) add(d time.Duration) { c.ns.Add(int64(d)) }
func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func keySetVerifier(t *testing.T, cfg auth.KeySetConfig) (*auth.KeySet, *auth.Verifier) {
	t.Helper()
	ks, err := auth.NewKeySet(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.New(auth.Config{Keys: ks, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	return ks, v
}

func wantUser(t *testing.T, v *auth.Verifier, token, what string) {
	t.Helper()
	if user, _, err := v.Verify(token); err != nil || user != "alice" {
		t.Errorf("%s: Verify = %q, %v; want alice", what, user, err)
	}
}

func wantErr(t *testing.T, v *auth.Verifier, token string, sentinel error, text, what string) {
	t.Helper()
	_, _, err := v.Verify(token)
	if !errors.Is(err, sentinel) || !strings.Contains(fmt.Sprint(err), text) {
		t.Errorf("%s: Verify err = %v, want %v containing %q", what, err, sentinel, text)
	}
}

// TestKeySetFile verifies tokens with the keys of a JWK Set file, each
// named by its kid, of every kind.
func TestKeySetFile(t *testing.T) {
	k := genKeys(t)
	path := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, path, jwks(t,
		jwk(t, "r", &k.rsa.PublicKey),
		jwk(t, "e", &k.ec.PublicKey, func(m map[string]any) { m["use"] = "sig" }),
		jwk(t, "d", k.ed.Public(), func(m map[string]any) { m["key_ops"] = []string{"verify"} }),
		jwk(t, "h", k.secret, func(m map[string]any) { m["alg"] = "HS384" }),
	))
	ks, v := keySetVerifier(t, auth.KeySetConfig{Source: path})
	if got := strings.Join(ks.IDs(), ","); got != "r,e,d,h" {
		t.Errorf("IDs = %s, want r,e,d,h", got)
	}
	if v.KeyKind() != "key set" || !strings.Contains(strings.Join(v.Algorithms(), ","), "PS256") {
		t.Errorf("KeyKind, Algorithms = %s, %v", v.KeyKind(), v.Algorithms())
	}
	wantUser(t, v, signKID(t, jwt.SigningMethodRS256, k.rsa, "r"), "RS256 by r")
	wantUser(t, v, signKID(t, jwt.SigningMethodPS512, k.rsa, "r"), "PS512 by r")
	wantUser(t, v, signKID(t, jwt.SigningMethodES256, k.ec, "e"), "ES256 by e")
	wantUser(t, v, signKID(t, jwt.SigningMethodEdDSA, k.ed, "d"), "EdDSA by d")
	wantUser(t, v, signKID(t, jwt.SigningMethodHS384, k.secret, "h"), "HS384 by h")
	// Without a kid, the one key that takes the algorithm.
	wantUser(t, v, signKID(t, jwt.SigningMethodES256, k.ec, ""), "ES256 without kid")

	wantErr(t, v, signKID(t, jwt.SigningMethodHS256, k.secret, "h"), auth.ErrAlgorithm, `key "h" takes HS384`, "HS256 by h, whose alg is HS384")
	wantErr(t, v, signKID(t, jwt.SigningMethodHS256, k.rsaPEM, "r"), auth.ErrAlgorithm, `key "r" takes RS256`, "an RSA key used as an HMAC secret")
	wantErr(t, v, signKID(t, jwt.SigningMethodRS256, k.rsa2, "r"), auth.ErrBadSignature, "", "signed by another RSA key, named r")
	wantErr(t, v, signKID(t, jwt.SigningMethodRS256, k.rsa, "zz"), auth.ErrUnknownKey, `"zz"`, "kid zz")
	wantErr(t, v, unsigned(`{"alg":"RS256","kid":7}`, `{"sub":"alice"}`), auth.ErrUnknownKey, "not a string", "a kid that is a number")
	wantErr(t, v, unsigned(`{"alg":"none"}`, `{"sub":"alice"}`), auth.ErrAlgorithm, "", "alg none")

	if _, err := auth.New(auth.Config{Keys: ks, Secret: k.secret}); !errors.Is(err, auth.ErrInvalidConfig) {
		t.Errorf("New with a key set and a secret: err = %v, want ErrInvalidConfig", err)
	}
}

// TestKeySetWithoutKID checks a token without a kid against the keys
// that take its algorithm, while there are at most MaxKeysWithoutKID.
func TestKeySetWithoutKID(t *testing.T) {
	secret := func(i int) []byte { return []byte(fmt.Sprintf("secret number %d of the set, 32+ bytes", i)) }
	dir := t.TempDir()
	two, five := filepath.Join(dir, "two.json"), filepath.Join(dir, "five.json")
	writeFile(t, two, jwks(t, jwk(t, "old", secret(0)), jwk(t, "new", secret(1))))
	var keys []map[string]any
	for i := range auth.MaxKeysWithoutKID + 1 {
		keys = append(keys, jwk(t, fmt.Sprint(i), secret(i)))
	}
	writeFile(t, five, jwks(t, keys...))

	_, v := keySetVerifier(t, auth.KeySetConfig{Source: two})
	wantUser(t, v, signKID(t, jwt.SigningMethodHS256, secret(0), ""), "signed by the first of two, no kid")
	wantUser(t, v, signKID(t, jwt.SigningMethodHS256, secret(1), ""), "signed by the second of two, no kid")
	wantErr(t, v, signKID(t, jwt.SigningMethodHS256, secret(2), ""), auth.ErrBadSignature, "", "signed by neither")

	_, v = keySetVerifier(t, auth.KeySetConfig{Source: five})
	wantErr(t, v, signKID(t, jwt.SigningMethodHS256, secret(0), ""), auth.ErrUnknownKey, "name the key with a kid", "five keys, no kid")
	wantUser(t, v, signKID(t, jwt.SigningMethodHS256, secret(4), "4"), "five keys, kid 4")
}

// TestKeySetRotation rotates the keys of a file under a live verifier:
// the new key is taken as soon as a token names it, the old one is
// taken until the set is read without it.
func TestKeySetRotation(t *testing.T) {
	k := genKeys(t)
	path := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, path, jwks(t, jwk(t, "2026-11", k.ed.Public())))
	clk := newClock()
	ks, v := keySetVerifier(t, auth.KeySetConfig{Source: path, MinRefresh: time.Minute, Now: clk.now})
	oldTok := signKID(t, jwt.SigningMethodEdDSA, k.ed, "2026-11")
	newTok := signKID(t, jwt.SigningMethodEdDSA, k.ed2, "2026-12")
	wantUser(t, v, oldTok, "the old key")

	// The new key is published beside the old one: the first token that
	// names it has the file read again.
	writeFile(t, path, jwks(t, jwk(t, "2026-11", k.ed.Public()), jwk(t, "2026-12", k.ed2.Public())))
	wantUser(t, v, newTok, "the new key, published beside the old")
	wantUser(t, v, oldTok, "the old key, still published")

	// The old key is removed: its tokens are taken until the next read.
	writeFile(t, path, jwks(t, jwk(t, "2026-12", k.ed2.Public())))
	wantUser(t, v, oldTok, "the old key, removed from the file but not read yet")
	if err := ks.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantErr(t, v, oldTok, auth.ErrUnknownKey, `"2026-11"`, "the old key, after the read")
	wantUser(t, v, newTok, "the new key, after the read")

	// A token that names a key the set lacks reads the file at most once
	// a MinRefresh.
	writeFile(t, path, jwks(t, jwk(t, "2026-12", k.ed2.Public()), jwk(t, "2026-11", k.ed.Public())))
	wantErr(t, v, oldTok, auth.ErrUnknownKey, `"2026-11"`, "the old key, back in the file within MinRefresh of the last read a token asked for")
	clk.add(time.Minute)
	wantUser(t, v, oldTok, "the old key, back in the file, a MinRefresh later")
}

// jwksServer serves a JWK Set document the test changes, counting reads.
type jwksServer struct {
	*httptest.Server
	doc   atomic.Pointer[[]byte]
	reads atomic.Int64
	// slow, when set, holds every request until the test ends.
	slow    atomic.Bool
	release chan struct{}
	status  atomic.Int64
}

func newJWKSServer(t *testing.T, doc []byte) *jwksServer {
	s := &jwksServer{release: make(chan struct{})}
	s.set(doc)
	s.status.Store(http.StatusOK)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.reads.Add(1)
		if s.slow.Load() {
			select {
			case <-s.release:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.WriteHeader(int(s.status.Load()))
		_, _ = w.Write(*s.doc.Load())
	}))
	t.Cleanup(s.Close)
	t.Cleanup(func() { close(s.release) })
	return s
}

func (s *jwksServer) set(doc []byte) { s.doc.Store(&doc) }

// TestKeySetURL reads a provider's JWK Set over HTTP: again when a token
// names an unknown kid, at most once a MinRefresh however many such
// tokens come, and concurrent ones share the read.
func TestKeySetURL(t *testing.T) {
	k := genKeys(t)
	srv := newJWKSServer(t, jwks(t, jwk(t, "a", &k.ec.PublicKey)))
	clk := newClock()
	var logs syncbuf.Buffer
	_, v := keySetVerifier(t, auth.KeySetConfig{Source: srv.URL + "/jwks.json", MinRefresh: time.Minute, Now: clk.now,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if n := srv.reads.Load(); n != 1 {
		t.Fatalf("reads after NewKeySet = %d, want 1", n)
	}
	wantUser(t, v, signKID(t, jwt.SigningMethodES256, k.ec, "a"), "key a")

	srv.set(jwks(t, jwk(t, "a", &k.ec.PublicKey), jwk(t, "b", &k.rsa.PublicKey)))
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { wantUser(t, v, signKID(t, jwt.SigningMethodRS256, k.rsa, "b"), "key b, just published") })
	}
	wg.Wait()
	if n := srv.reads.Load(); n != 2 {
		t.Errorf("reads after 20 tokens naming a new kid at once = %d, want 2", n)
	}
	for i := range 50 {
		wantErr(t, v, signKID(t, jwt.SigningMethodRS256, k.rsa, fmt.Sprint("forged-", i)), auth.ErrUnknownKey, "forged", "a forged kid")
	}
	if n := srv.reads.Load(); n != 2 {
		t.Errorf("reads after 50 forged kids within MinRefresh = %d, want 2", n)
	}
	clk.add(time.Minute)
	wantErr(t, v, signKID(t, jwt.SigningMethodRS256, k.rsa, "forged"), auth.ErrUnknownKey, "forged", "a forged kid a MinRefresh later")
	if n := srv.reads.Load(); n != 3 {
		t.Errorf("reads after a forged kid a MinRefresh later = %d, want 3", n)
	}
	if !strings.Contains(logs.String(), "kids=a,b") {
		t.Errorf("the log does not name the keys read:\n%s", logs.String())
	}
}

// TestWaitsForKeys: a token whose kid the key set lacks is the one whose
// verification may wait for the set to be read again; once the set holds
// the key, it no longer is. Tokens without a kid, that are not JWTs, and
// every token of a verifier with one key never wait.
func TestWaitsForKeys(t *testing.T) {
	k := genKeys(t)
	path := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, path, jwks(t, jwk(t, "a", &k.ec.PublicKey)))
	ks, v := keySetVerifier(t, auth.KeySetConfig{Source: path})
	b := signKID(t, jwt.SigningMethodRS256, k.rsa, "b")
	for _, c := range []struct {
		what, token string
		want        bool
	}{
		{"kid a, in the set", signKID(t, jwt.SigningMethodES256, k.ec, "a"), false},
		{"kid b, not in the set", b, true},
		{"no kid", signKID(t, jwt.SigningMethodES256, k.ec, ""), false},
		{"a kid that is a number", unsigned(`{"alg":"RS256","kid":7}`, `{"sub":"alice"}`), false},
		{"not a JWT", "garbage", false},
	} {
		if got := v.WaitsForKeys(c.token); got != c.want {
			t.Errorf("WaitsForKeys(%s) = %v, want %v", c.what, got, c.want)
		}
	}
	writeFile(t, path, jwks(t, jwk(t, "a", &k.ec.PublicKey), jwk(t, "b", &k.rsa.PublicKey)))
	if err := ks.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v.WaitsForKeys(b) {
		t.Error("WaitsForKeys(kid b) once the set holds b = true, want false")
	}
	one, err := auth.New(auth.Config{Secret: k.secret})
	if err != nil {
		t.Fatal(err)
	}
	if one.WaitsForKeys(b) {
		t.Error("WaitsForKeys of a verifier with one key = true, want false")
	}
}

// TestKeySetBadReadKeepsKeys reads the set again while the provider
// serves a bad document, an error, or nothing for longer than the
// timeout: each read fails, is logged, and the keys read before stay.
func TestKeySetBadReadKeepsKeys(t *testing.T) {
	k := genKeys(t)
	good := jwks(t, jwk(t, "a", k.ed.Public()))
	srv := newJWKSServer(t, good)
	var logs syncbuf.Buffer
	ks, v := keySetVerifier(t, auth.KeySetConfig{Source: srv.URL, Timeout: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	token := signKID(t, jwt.SigningMethodEdDSA, k.ed, "a")

	for _, c := range []struct {
		name  string
		serve func()
		want  string
	}{
		{"not JSON", func() { srv.set([]byte("<html>")) }, "not a JWK Set"},
		{"no usable key", func() { srv.set(jwks(t, jwk(t, "x", k.secret))) }, "no usable key"},
		{"HTTP 503", func() { srv.set(good); srv.status.Store(http.StatusServiceUnavailable) }, "503"},
		{"slower than the timeout", func() { srv.status.Store(http.StatusOK); srv.slow.Store(true) }, "deadline exceeded"},
	} {
		c.serve()
		err := ks.Read(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Read err = %v, want one containing %q", c.name, err, c.want)
		}
		wantUser(t, v, token, c.name+": the key read before")
	}
	if n := strings.Count(logs.String(), "keeping the keys read before"); n != 4 {
		t.Errorf("%d failed reads logged, want 4:\n%s", n, logs.String())
	}
	// A token naming a kid the set lacks, while the provider hangs, is
	// refused once the read times out.
	wantErr(t, v, signKID(t, jwt.SigningMethodEdDSA, k.ed2, "b"), auth.ErrUnknownKey, `"b"`, "a new kid while the provider hangs")
}

// TestNewKeySetRefusesBadSets names what is wrong with a set that cannot
// be read at start, or holds no key that can be used.
func TestNewKeySetRefusesBadSets(t *testing.T) {
	k := genKeys(t)
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var many []map[string]any
	for i := range auth.MaxKeySetKeys + 1 {
		many = append(many, jwk(t, fmt.Sprint(i), k.ed.Public()))
	}
	published := newJWKSServer(t, jwks(t, jwk(t, "h", k.secret)))
	missing := newJWKSServer(t, []byte("not found"))
	missing.status.Store(http.StatusNotFound)
	hanging := newJWKSServer(t, nil)
	hanging.slow.Store(true)

	for _, c := range []struct {
		name string
		doc  []byte // written to a file, unless source is given
		src  string
		want string
	}{
		{"no file", nil, filepath.Join(dir, "none.json"), "no such file"},
		{"not JSON", []byte("-----BEGIN PUBLIC KEY-----"), "", "not a JWK Set"},
		{"no keys member", []byte(`{"kty":"OKP"}`), "", `no "keys" member`},
		{"no keys", jwks(t), "", "the set is empty"},
		{"too many keys", jwks(t, many...), "", "65 keys: want at most 64"},
		{"too big", append(jwks(t), bytes.Repeat([]byte(" "), auth.MaxKeySetBytes)...), "", "over 1048576 bytes"},
		{"a private key", jwks(t, jwk(t, "p", k.ed)), "", "a private key: give only its public part"},
		{"an encryption key", jwks(t, jwk(t, "enc", &k.rsa.PublicKey, func(m map[string]any) { m["use"] = "enc" })), "", `use "enc", not sig`},
		{"no verify op", jwks(t, jwk(t, "o", &k.rsa.PublicKey, func(m map[string]any) { m["key_ops"] = []string{"encrypt"} })), "", "lack verify"},
		{"a weak RSA key", jwks(t, jwk(t, "w", &weak.PublicKey)), "", "RSA key of 1024 bits"},
		{"a short secret", jwks(t, jwk(t, "s", []byte("short"))), "", "HMAC secret is 5 bytes"},
		{"alg of another kind", jwks(t, jwk(t, "m", k.ed.Public(), func(m map[string]any) { m["alg"] = "RS256" })), "", `alg "RS256" does not fit a Ed25519 public key`},
		{"unknown kty", []byte(`{"keys":[{"kty":"XYZ","kid":"u"}]}`), "", `kty "XYZ"`},
		{"bad RSA numbers", []byte(`{"keys":[{"kty":"RSA","kid":"b","n":"!!","e":"AQAB"}]}`), "", `kid "b"`},
		{"a secret published at a URL", nil, published.URL, "an HMAC secret, which a set read from a URL must not publish"},
		{"HTTP 404", nil, missing.URL, "GET answered 404 Not Found"},
		{"a URL slower than the timeout", nil, hanging.URL, "deadline exceeded"},
	} {
		src := c.src
		if src == "" {
			src = filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
			writeFile(t, src, c.doc)
		}
		_, err := auth.NewKeySet(context.Background(), auth.KeySetConfig{Source: src, Timeout: 200 * time.Millisecond})
		if !errors.Is(err, auth.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: NewKeySet err = %v, want ErrInvalidConfig containing %q", c.name, err, c.want)
		}
	}
	if _, err := auth.NewKeySet(context.Background(), auth.KeySetConfig{}); !errors.Is(err, auth.ErrInvalidConfig) {
		t.Errorf("NewKeySet without a source: err = %v", err)
	}

	// A set with a usable key beside unusable ones is read, and says
	// which it left out.
	var logs syncbuf.Buffer
	path := filepath.Join(dir, "mixed.json")
	writeFile(t, path, jwks(t, jwk(t, "enc", &k.rsa.PublicKey, func(m map[string]any) { m["use"] = "enc" }), jwk(t, "ok", k.ed.Public())))
	ks, err := auth.NewKeySet(context.Background(), auth.KeySetConfig{Source: path, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if ids := ks.IDs(); len(ids) != 1 || ids[0] != "ok" {
		t.Errorf("IDs = %v, want [ok]", ids)
	}
	if !strings.Contains(logs.String(), `use \"enc\", not sig`) {
		t.Errorf("the key left out is not logged:\n%s", logs.String())
	}
}
