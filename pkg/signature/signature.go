// Package signature signs the HTTP requests greendot sends to an app (its
// webhooks, and its questions under the app authorization policy) and the
// ones the app sends back (invalidations), and checks them: one header,
// "Greendot-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>", keyed with a
// shared secret, over the timestamp, a full stop and the body.
package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Header is the request header that carries a signature:
// "t=<unix seconds>,v1=<hex HMAC-SHA256>".
const Header = "Greendot-Signature"

// DefaultTolerance is how far from the receiver's clock a signature's
// timestamp may be, unless Verify is told otherwise.
const DefaultTolerance = 5 * time.Minute

// Errors of Verify. Each error Verify returns wraps one of them.
var (
	// ErrNoSignature means the header is empty.
	ErrNoSignature = errors.New("signature: no signature")
	// ErrMalformedSignature means the header is not t=<unix>,v1=<hex>.
	ErrMalformedSignature = errors.New("signature: malformed signature header")
	// ErrSignatureMismatch means no v1 of the header is the body's
	// signature with the secret: the body was changed, or signed with
	// another secret.
	ErrSignatureMismatch = errors.New("signature: signature does not match")
	// ErrStaleSignature means the timestamp is further from now than the
	// tolerance: a replay of an old request, or a clock far off.
	ErrStaleSignature = errors.New("signature: signature timestamp outside the tolerance")
)

// Signature returns the hex HMAC-SHA256, with secret as the key, of the
// timestamp t (unix seconds, in decimal), a full stop, and body: the v1
// value of the signature header.
func Signature(secret []byte, t int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(strconv.FormatInt(t, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// Sign returns the value of Header for body sent at now: one v1 for
// secret, and one more for each of others (the secrets of a rotation,
// which a receiver may still check with).
func Sign(secret []byte, now time.Time, body []byte, others ...[]byte) string {
	t := now.Unix()
	h := "t=" + strconv.FormatInt(t, 10) + ",v1=" + Signature(secret, t, body)
	for _, o := range others {
		h += ",v1=" + Signature(o, t, body)
	}
	return h
}

// Verify checks a request: header is its Header, body its request body
// exactly as received, now the receiver's clock. It returns
// nil when one of the header's v1 values is the signature of body with
// secret and its timestamp is within tolerance of now (zero means
// DefaultTolerance), so that a request recorded and sent again later is
// refused. The comparison takes constant time.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	if header == "" {
		return ErrNoSignature
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	var (
		t    int64
		tSet bool
		sigs [][]byte
	)
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return fmt.Errorf("%w: %q is not key=value", ErrMalformedSignature, part)
		}
		switch k {
		case "t":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || tSet {
				return fmt.Errorf("%w: timestamp %q", ErrMalformedSignature, v)
			}
			t, tSet = n, true
		case "v1":
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				return fmt.Errorf("%w: v1 %q is not a hex SHA-256 HMAC", ErrMalformedSignature, v)
			}
			sigs = append(sigs, sig)
		default:
			// Other schemes, which a later version may add, are ignored.
		}
	}
	if !tSet || len(sigs) == 0 {
		return fmt.Errorf("%w: want t=<unix seconds>,v1=<hex>", ErrMalformedSignature)
	}
	if d := now.Sub(time.Unix(t, 0)).Abs(); d > tolerance {
		return fmt.Errorf("%w: signed at %s, %v from now (tolerance %v)", ErrStaleSignature,
			time.Unix(t, 0).UTC().Format(time.RFC3339), d.Round(time.Second), tolerance)
	}
	want, _ := hex.DecodeString(Signature(secret, t, body))
	for _, sig := range sigs {
		if hmac.Equal(sig, want) {
			return nil
		}
	}
	return ErrSignatureMismatch
}
