package samples

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/pkg/auth"
)

// signSample signs the claims of a JSON sample as an HS256 JWT, and returns
// it with a verifier whose clock is an hour before the sample's exp.
func signSample(t *testing.T, b doctest.Block) (string, *auth.Verifier) {
	t.Helper()
	var claims jwt.MapClaims
	if err := json.Unmarshal([]byte(b.Text), &claims); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	exp, err := claims.GetExpirationTime()
	if err != nil || exp == nil {
		t.Fatalf("%s: no exp: %v", b, err)
	}
	secret := []byte("the JWT secret of the claims samples")
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.New(auth.Config{Secret: secret, Now: func() time.Time { return exp.Add(-time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	return token, v
}

// TestTokenClaimSamples: the claims docs/integration.md shows, signed, are
// what the gateway's verifier reads: alice, who may watch bob and carol,
// and join doc:42 and the rooms of game:7.
func TestTokenClaimSamples(t *testing.T) {
	watch := doctest.Sample(t, "docs/integration.md", `"watch": [`)
	token, v := signSample(t, watch)
	if user, _, users, err := v.VerifyWatch(token); err != nil || user != "alice" || !slices.Equal(users, []string{"bob", "carol"}) {
		t.Errorf("%s: VerifyWatch = %q, %q, %v; want alice watching bob and carol", watch, user, users, err)
	}
	rooms := doctest.Sample(t, "docs/integration.md", `"rooms": [`)
	token, v = signSample(t, rooms)
	if user, _, got, err := v.VerifyRooms(token); err != nil || user != "alice" || !slices.Equal(got, []string{"doc:42", "game:7:*"}) {
		t.Errorf("%s: VerifyRooms = %q, %q, %v; want alice in doc:42 and game:7:*", rooms, user, got, err)
	}
}
