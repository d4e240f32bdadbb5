package signature_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/signature"
)

func TestVerify(t *testing.T) {
	secret := []byte("0123456789abcdef0123")
	body := []byte(`{"events":[{"user_id":"alice","status":"offline","devices":0,"rev":7,"at":1}]}`)
	now := time.Unix(1_800_000_000, 0)
	good := signature.Sign(secret, now, body)
	sig := signature.Signature(secret, now.Unix(), body)
	ts := strconv.FormatInt(now.Unix(), 10)

	for _, tc := range []struct {
		name   string
		secret []byte
		header string
		body   []byte
		now    time.Time
		want   error
	}{
		{"good", secret, good, body, now, nil},
		{"within tolerance", secret, good, body, now.Add(4 * time.Minute), nil},
		{"a second v1 of a rotated secret", secret, "t=" + ts + ",v1=" + signature.Signature([]byte("the-secret-before-0000"), now.Unix(), body) + ",v1=" + sig, body, now, nil},
		{"another scheme is ignored", secret, "t=" + ts + ",v0=zz,v1=" + sig, body, now, nil},
		{"wrong secret", []byte("another-secret-0123456"), good, body, now, signature.ErrSignatureMismatch},
		{"body changed", secret, good, []byte(`{"events":[{"user_id":"alice","status":"online","devices":1,"rev":7,"at":1}]}`), now, signature.ErrSignatureMismatch},
		{"timestamp changed", secret, "t=" + strconv.FormatInt(now.Unix()+1, 10) + ",v1=" + sig, body, now, signature.ErrSignatureMismatch},
		{"stale", secret, good, body, now.Add(6 * time.Minute), signature.ErrStaleSignature},
		{"from the future", secret, good, body, now.Add(-6 * time.Minute), signature.ErrStaleSignature},
		{"empty", secret, "", body, now, signature.ErrNoSignature},
		{"no timestamp", secret, "v1=" + sig, body, now, signature.ErrMalformedSignature},
		{"no v1", secret, "t=" + ts, body, now, signature.ErrMalformedSignature},
		{"v1 not hex", secret, "t=" + ts + ",v1=xyz", body, now, signature.ErrMalformedSignature},
		{"timestamp not a number", secret, "t=soon,v1=" + sig, body, now, signature.ErrMalformedSignature},
		{"two timestamps", secret, "t=" + ts + ",t=" + ts + ",v1=" + sig, body, now, signature.ErrMalformedSignature},
		{"not key=value", secret, "t=" + ts + ",garbage", body, now, signature.ErrMalformedSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := signature.Verify(tc.secret, tc.header, tc.body, tc.now, 0)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("Verify = %v, want %v", err, tc.want)
			}
		})
	}

	// A tolerance given is the one used.
	if err := signature.Verify(secret, good, body, now.Add(30*time.Second), 10*time.Second); !errors.Is(err, signature.ErrStaleSignature) {
		t.Errorf("30s late with a 10s tolerance: %v, want stale", err)
	}
}

// TestSignatureAlgorithm pins the algorithm the documentation gives other
// languages: hex(HMAC-SHA256(secret, "<t>.<body>")).
func TestSignatureAlgorithm(t *testing.T) {
	// Computed with: printf '%s' '1800000000.{}' | openssl dgst -sha256 -hmac 'whsec-0123456789ab'
	const want = "2b986385cf3ba903db619fc3932cc961ac80e92009fe1a8f90b09c151f378f50"
	got := signature.Signature([]byte("whsec-0123456789ab"), 1_800_000_000, []byte("{}"))
	if got != want {
		t.Errorf("Signature = %s, want %s", got, want)
	}
}
