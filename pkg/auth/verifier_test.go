package auth_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/auth"
)

var _ gateway.TokenVerifier = (*auth.Verifier)(nil)

// now is the fixed clock of these tests.
var now = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return now }

// keys holds one key pair of every kind, generated once.
type keys struct {
	secret   []byte
	rsa      *rsa.PrivateKey
	rsa2     *rsa.PrivateKey
	ec       *ecdsa.PrivateKey
	ec384    *ecdsa.PrivateKey
	ed       ed25519.PrivateKey
	ed2      ed25519.PrivateKey
	rsaPEM   []byte
	ecPEM    []byte
	ed25PEM  []byte
	certPEM  []byte
	pkcs1PEM []byte
}

func genKeys(t *testing.T) *keys {
	t.Helper()
	k := &keys{secret: []byte("0123456789abcdef0123456789abcdef")}
	var err error
	if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if k.rsa2, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if k.ec384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if _, k.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		t.Fatal(err)
	}
	if _, k.ed2, err = ed25519.GenerateKey(rand.Reader); err != nil {
		t.Fatal(err)
	}
	k.rsaPEM = pkixPEM(t, &k.rsa.PublicKey)
	k.ecPEM = pkixPEM(t, &k.ec.PublicKey)
	k.ed25PEM = pkixPEM(t, k.ed.Public())
	k.pkcs1PEM = pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&k.rsa.PublicKey)})
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "greendot test issuer"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.ec.Public(), k.ec)
	if err != nil {
		t.Fatal(err)
	}
	k.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return k
}

func pkixPEM(t *testing.T, pub crypto.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func sign(t *testing.T, m jwt.SigningMethod, key any, claims jwt.Claims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatalf("sign %s: %v", m.Alg(), err)
	}
	return s
}

// claims returns valid claims for alice, expiring in an hour.
func claims() jwt.RegisteredClaims {
	return jwt.RegisteredClaims{
		Subject:   "alice",
		ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)),
		IssuedAt:  jwt.NewNumericDate(now.Add(-time.Minute)),
	}
}

func with(f func(*jwt.RegisteredClaims)) jwt.RegisteredClaims {
	c := claims()
	f(&c)
	return c
}

// unsigned builds a token with a given header and claims and a junk
// signature, as a hostile client would.
func unsigned(header, payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(header)) + "." + enc([]byte(payload)) + "." + enc([]byte("sig"))
}

func TestVerify(t *testing.T) {
	k := genKeys(t)
	hmac := auth.Config{Secret: k.secret}
	rsaCfg := auth.Config{PublicKey: k.rsaPEM}
	ecCfg := auth.Config{PublicKey: k.ecPEM}
	edCfg := auth.Config{PublicKey: k.ed25PEM}

	tests := []struct {
		name    string
		cfg     auth.Config
		token   string
		wantErr error
		wantMsg string // a substring of the error, when set
		wantExp time.Time
	}{
		{name: "HS256", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, claims())},
		{name: "HS512", cfg: hmac, token: sign(t, jwt.SigningMethodHS512, k.secret, claims())},
		{name: "RS256", cfg: rsaCfg, token: sign(t, jwt.SigningMethodRS256, k.rsa, claims())},
		{name: "PS256", cfg: rsaCfg, token: sign(t, jwt.SigningMethodPS256, k.rsa, claims())},
		{name: "RS256 with PKCS1 PEM", cfg: auth.Config{PublicKey: k.pkcs1PEM}, token: sign(t, jwt.SigningMethodRS256, k.rsa, claims())},
		{name: "ES256", cfg: ecCfg, token: sign(t, jwt.SigningMethodES256, k.ec, claims())},
		{name: "ES256 with certificate", cfg: auth.Config{PublicKey: k.certPEM}, token: sign(t, jwt.SigningMethodES256, k.ec, claims())},
		{name: "EdDSA", cfg: edCfg, token: sign(t, jwt.SigningMethodEdDSA, k.ed, claims())},
		{
			name: "issuer and audience match",
			cfg:  auth.Config{Secret: k.secret, Issuer: "https://id.example", Audience: "greendot"},
			token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) {
				c.Issuer, c.Audience = "https://id.example", jwt.ClaimStrings{"other", "greendot"}
			})),
		},
		{
			name:    "expired within leeway",
			cfg:     auth.Config{Secret: k.secret, Leeway: 10 * time.Second},
			token:   sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.ExpiresAt = jwt.NewNumericDate(now.Add(-5 * time.Second)) })),
			wantExp: now.Add(5 * time.Second),
		},

		// Algorithms outside the key's kind.
		{name: "none", cfg: hmac, token: sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims()), wantErr: auth.ErrAlgorithm, wantMsg: `"none"`},
		{name: "none against a public key", cfg: rsaCfg, token: unsigned(`{"alg":"none","typ":"JWT"}`, `{"sub":"alice","exp":9999999999}`), wantErr: auth.ErrAlgorithm},
		{name: "HS256 signed with the public key PEM", cfg: rsaCfg, token: sign(t, jwt.SigningMethodHS256, k.rsaPEM, claims()), wantErr: auth.ErrAlgorithm, wantMsg: "RSA public key accepts RS256"},
		{name: "HS256 against an Ed25519 key", cfg: edCfg, token: sign(t, jwt.SigningMethodHS256, k.ed25PEM, claims()), wantErr: auth.ErrAlgorithm},
		{name: "RS256 against an HMAC secret", cfg: hmac, token: sign(t, jwt.SigningMethodRS256, k.rsa, claims()), wantErr: auth.ErrAlgorithm},
		{name: "RS256 against an ECDSA key", cfg: ecCfg, token: sign(t, jwt.SigningMethodRS256, k.rsa, claims()), wantErr: auth.ErrAlgorithm},
		{name: "ES384 against a P-256 key", cfg: ecCfg, token: sign(t, jwt.SigningMethodES384, k.ec384, claims()), wantErr: auth.ErrAlgorithm},
		{name: "unknown alg", cfg: hmac, token: unsigned(`{"alg":"XS999","typ":"JWT"}`, `{"sub":"alice","exp":9999999999}`), wantErr: auth.ErrAlgorithm},

		// Wrong keys and tampering.
		{name: "HS256 wrong secret", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, []byte("another secret of thirty-two bytes!!"), claims()), wantErr: auth.ErrBadSignature},
		{name: "RS256 wrong key", cfg: rsaCfg, token: sign(t, jwt.SigningMethodRS256, k.rsa2, claims()), wantErr: auth.ErrBadSignature},
		{name: "EdDSA wrong key", cfg: edCfg, token: sign(t, jwt.SigningMethodEdDSA, k.ed2, claims()), wantErr: auth.ErrBadSignature},
		{name: "payload swapped", cfg: hmac, token: swapPayload(sign(t, jwt.SigningMethodHS256, k.secret, claims()), `{"sub":"mallory","exp":9999999999}`), wantErr: auth.ErrBadSignature},
		{name: "signature stripped", cfg: rsaCfg, token: stripSignature(sign(t, jwt.SigningMethodRS256, k.rsa, claims())), wantErr: auth.ErrBadSignature},

		// Claims.
		{name: "expired", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.ExpiresAt = jwt.NewNumericDate(now.Add(-time.Second)) })), wantErr: auth.ErrExpired, wantMsg: "token expired at 2026-11-23T11:59:59Z"},
		{name: "expired beyond leeway", cfg: auth.Config{Secret: k.secret, Leeway: time.Second}, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.ExpiresAt = jwt.NewNumericDate(now.Add(-2 * time.Second)) })), wantErr: auth.ErrExpired},
		{name: "missing exp", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.ExpiresAt = nil })), wantErr: auth.ErrNoExpiry, wantMsg: "token has no exp claim"},
		{name: "missing exp and wrong issuer", cfg: auth.Config{Secret: k.secret, Issuer: "me"}, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.ExpiresAt, c.Issuer = nil, "you" })), wantErr: auth.ErrNoExpiry},
		{name: "not before in the future", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.NotBefore = jwt.NewNumericDate(now.Add(time.Minute)) })), wantErr: auth.ErrNotYetValid},
		{name: "issued in the future", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.IssuedAt = jwt.NewNumericDate(now.Add(time.Minute)) })), wantErr: auth.ErrNotYetValid},
		{name: "missing sub", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.Subject = "" })), wantErr: auth.ErrNoSubject},
		{name: "sub not a user id", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.Subject = "alice.>" })), wantErr: auth.ErrBadSubject},
		{name: "sub too long", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.Subject = strings.Repeat("a", 65) })), wantErr: auth.ErrBadSubject},
		{name: "wrong issuer", cfg: auth.Config{Secret: k.secret, Issuer: "https://id.example"}, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.Issuer = "https://evil.example" })), wantErr: auth.ErrIssuer, wantMsg: "evil.example"},
		{name: "missing issuer", cfg: auth.Config{Secret: k.secret, Issuer: "https://id.example"}, token: sign(t, jwt.SigningMethodHS256, k.secret, claims()), wantErr: auth.ErrIssuer, wantMsg: "no iss claim"},
		{name: "wrong audience", cfg: auth.Config{Secret: k.secret, Audience: "greendot"}, token: sign(t, jwt.SigningMethodHS256, k.secret, with(func(c *jwt.RegisteredClaims) { c.Audience = jwt.ClaimStrings{"billing"} })), wantErr: auth.ErrAudience},
		{name: "missing audience", cfg: auth.Config{Secret: k.secret, Audience: "greendot"}, token: sign(t, jwt.SigningMethodHS256, k.secret, claims()), wantErr: auth.ErrAudience, wantMsg: "no aud claim"},

		// Garbage.
		{name: "empty", cfg: hmac, token: "", wantErr: auth.ErrMalformed},
		{name: "one segment", cfg: hmac, token: "garbage", wantErr: auth.ErrMalformed},
		{name: "three junk segments", cfg: hmac, token: "a.b.c", wantErr: auth.ErrMalformed},
		{name: "header not JSON", cfg: hmac, token: unsigned(`not json`, `{}`), wantErr: auth.ErrMalformed},
		{name: "sub of the wrong type", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, jwt.MapClaims{"sub": 42, "exp": now.Add(time.Hour).Unix()}), wantErr: auth.ErrMalformed},
		{name: "exp of the wrong type", cfg: hmac, token: sign(t, jwt.SigningMethodHS256, k.secret, jwt.MapClaims{"sub": "alice", "exp": "tomorrow"}), wantErr: auth.ErrMalformed},
		{name: "too long", cfg: hmac, token: strings.Repeat("a", auth.MaxTokenLen+1), wantErr: auth.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Now = clock
			v, err := auth.New(cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			user, exp, err := v.Verify(tt.token)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Verify err = %v, want %v", err, tt.wantErr)
				}
				if tt.wantMsg != "" && !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("error %q does not contain %q", err, tt.wantMsg)
				}
				if user != "" || !exp.IsZero() {
					t.Errorf("refused token gave user %q, expiry %v", user, exp)
				}
				return
			}
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			wantExp := tt.wantExp
			if wantExp.IsZero() {
				wantExp = now.Add(time.Hour)
			}
			if user != "alice" || !exp.Equal(wantExp) {
				t.Errorf("got %q, %v; want alice, %v", user, exp, wantExp)
			}
		})
	}
}

func swapPayload(token, payload string) string {
	parts := strings.Split(token, ".")
	parts[1] = base64.RawURLEncoding.EncodeToString([]byte(payload))
	return strings.Join(parts, ".")
}

func stripSignature(token string) string {
	return token[:strings.LastIndex(token, ".")+1]
}

func TestNewRefusesBadConfig(t *testing.T) {
	k := genKeys(t)
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaPriv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k.rsa)})
	tests := []struct {
		name    string
		cfg     auth.Config
		wantMsg string
	}{
		{"no key", auth.Config{}, "no key"},
		{"both keys", auth.Config{Secret: k.secret, PublicKey: k.rsaPEM}, "give one of an HMAC secret, a public key and a key set"},
		{"short secret", auth.Config{Secret: []byte("hunter2")}, "HMAC secret is 7 bytes: want at least 32"},
		{"negative leeway", auth.Config{Secret: k.secret, Leeway: -time.Second}, "leeway"},
		{"huge leeway", auth.Config{Secret: k.secret, Leeway: time.Hour}, "leeway"},
		{"not PEM", auth.Config{PublicKey: []byte("ssh-ed25519 AAAA")}, "no PEM block found"},
		{"blank file", auth.Config{PublicKey: []byte("\n \n")}, "empty"},
		{"private key", auth.Config{PublicKey: rsaPriv}, "is a private key"},
		{"two keys", auth.Config{PublicKey: append(append([]byte{}, k.rsaPEM...), k.ecPEM...)}, "more than one key"},
		{"small RSA", auth.Config{PublicKey: pkixPEM(t, &small.PublicKey)}, "1024 bits"},
		{"P-224", auth.Config{PublicKey: pkixPEM(t, &p224.PublicKey)}, "P-224"},
		{"corrupt block", auth.Config{PublicKey: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("junk")})}, `PEM block "PUBLIC KEY"`},
		{"odd block", auth.Config{PublicKey: pem.EncodeToMemory(&pem.Block{Type: "OPENSSH CONFIG", Bytes: []byte("x")})}, "want PUBLIC KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := auth.New(tt.cfg)
			if err == nil {
				t.Fatalf("New accepted the config: %v", v.Algorithms())
			}
			if !errors.Is(err, auth.ErrInvalidConfig) {
				t.Errorf("err = %v, want it to wrap ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("err = %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

func TestAlgorithms(t *testing.T) {
	k := genKeys(t)
	tests := []struct {
		name string
		cfg  auth.Config
		kind string
		want string
	}{
		{"secret", auth.Config{Secret: k.secret}, "HMAC secret", "HS256 HS384 HS512"},
		{"rsa", auth.Config{PublicKey: k.rsaPEM}, "RSA public key", "RS256 RS384 RS512 PS256 PS384 PS512"},
		{"ec p256", auth.Config{PublicKey: k.ecPEM}, "ECDSA public key", "ES256"},
		{"ec p384", auth.Config{PublicKey: pkixPEM(t, &k.ec384.PublicKey)}, "ECDSA public key", "ES384"},
		{"ed25519", auth.Config{PublicKey: k.ed25PEM}, "Ed25519 public key", "EdDSA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := auth.New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(v.Algorithms(), " "); got != tt.want {
				t.Errorf("Algorithms() = %q, want %q", got, tt.want)
			}
			if got := v.KeyKind(); got != tt.kind {
				t.Errorf("KeyKind() = %q, want %q", got, tt.kind)
			}
		})
	}
}

func TestSecretIsCopied(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := auth.New(auth.Config{Secret: secret, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	token := sign(t, jwt.SigningMethodHS256, []byte("0123456789abcdef0123456789abcdef"), claims())
	copy(secret, "XXXXXXXX")
	if _, _, err := v.Verify(token); err != nil {
		t.Fatalf("changing the caller's slice changed the verifier: %v", err)
	}
}

func TestVerifyWatch(t *testing.T) {
	k := genKeys(t)
	v, err := auth.New(auth.Config{Secret: k.secret, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	token := func(watch any) string {
		c := jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Hour).Unix()}
		if watch != nil {
			c["watch"] = watch
		}
		return sign(t, jwt.SigningMethodHS256, k.secret, c)
	}
	for _, tc := range []struct {
		name  string
		watch any
		want  []string
	}{
		{"no claim", nil, nil},
		{"empty list", []string{}, []string{}},
		{"list", []string{"bob", "carol"}, []string{"bob", "carol"}},
		{"repeats", []string{"bob", "carol", "bob", "bob"}, []string{"bob", "carol"}},
	} {
		sub, _, got, err := v.VerifyWatch(token(tc.watch))
		if err != nil || sub != "alice" || !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%s: %q, %v, %v; want alice, %v", tc.name, sub, got, err, tc.want)
		}
	}
	for _, bad := range []any{"bob", 3, []any{"bob", 1}, []string{"bob", "no such id!"}, map[string]any{}} {
		if _, _, _, err := v.VerifyWatch(token(bad)); !errors.Is(err, auth.ErrWatchClaim) {
			t.Errorf("watch %v: %v, want ErrWatchClaim", bad, err)
		}
	}
	// The claims are checked as by Verify.
	if _, _, _, err := v.VerifyWatch(sign(t, jwt.SigningMethodHS256, k.secret, jwt.MapClaims{"sub": "alice", "watch": []string{"bob"}})); !errors.Is(err, auth.ErrNoExpiry) {
		t.Errorf("no exp: %v, want ErrNoExpiry", err)
	}
}

func TestVerifyRooms(t *testing.T) {
	k := genKeys(t)
	v, err := auth.New(auth.Config{Secret: k.secret, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	token := func(rooms any) string {
		c := jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Hour).Unix()}
		if rooms != nil {
			c["rooms"] = rooms
		}
		return sign(t, jwt.SigningMethodHS256, k.secret, c)
	}
	for _, tc := range []struct {
		name  string
		rooms any
		want  []string
	}{
		{"no claim", nil, nil},
		{"empty list", []string{}, []string{}},
		{"ids and prefixes", []string{"doc:42", "game:*", "*"}, []string{"doc:42", "game:*", "*"}},
	} {
		sub, _, got, err := v.VerifyRooms(token(tc.rooms))
		if err != nil || sub != "alice" || !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%s: %q, %v, %v; want alice, %v", tc.name, sub, got, err, tc.want)
		}
	}
	for _, bad := range []any{"doc:42", 3, []any{"doc:42", 1}, []string{"doc.42"}, []string{"doc*x"}, []string{""}} {
		if _, _, _, err := v.VerifyRooms(token(bad)); !errors.Is(err, auth.ErrRoomsClaim) {
			t.Errorf("rooms %v: %v, want ErrRoomsClaim", bad, err)
		}
	}
}

// The gateway reads the rooms claim through this interface.
var _ gateway.RoomsVerifier = (*auth.Verifier)(nil)

// The gateway's token policy reads the watch claim through this interface.
var _ gateway.WatchVerifier = (*auth.Verifier)(nil)
