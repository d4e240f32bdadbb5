package auth_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/system/systest"
)

// TestGatewayAcceptsVerifiedTokens runs a gateway with a Verifier and
// connects with real tokens over real WebSockets.
func TestGatewayAcceptsVerifiedTokens(t *testing.T) {
	k := genKeys(t)
	v, err := auth.New(auth.Config{PublicKey: k.ed25PEM, Issuer: "https://id.example"})
	if err != nil {
		t.Fatal(err)
	}
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Tokens: v}})
	gw := sys.Gateway()
	token := func(sub, iss string, exp time.Time) string {
		return sign(t, jwt.SigningMethodEdDSA, k.ed, jwt.RegisteredClaims{Subject: sub, Issuer: iss, ExpiresAt: jwt.NewNumericDate(exp)})
	}

	good := token("carol", "https://id.example", time.Now().Add(time.Hour))
	c, err := client.Dial(context.Background(), gw.WS+"?token="+good, client.Options{})
	if err != nil {
		t.Fatalf("dial with ?token=: %v", err)
	}
	defer func() { _ = c.Abort() }()
	if c.Hello.UserID != "carol" {
		t.Errorf("hello user = %q, want carol", c.Hello.UserID)
	}

	c2, err := client.Dial(context.Background(), gw.WS, client.Options{Header: http.Header{"Authorization": {"Bearer " + good}}})
	if err != nil {
		t.Fatalf("dial with Authorization header: %v", err)
	}
	defer func() { _ = c2.Abort() }()

	for name, tok := range map[string]string{
		"expired":      token("carol", "https://id.example", time.Now().Add(-time.Minute)),
		"wrong issuer": token("carol", "https://evil.example", time.Now().Add(time.Hour)),
		"garbage":      "not-a-token",
	} {
		_, err := client.Dial(context.Background(), gw.WS+"?token="+tok, client.Options{})
		var he *client.HandshakeError
		if !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
			t.Errorf("%s token: err = %v, want a 401 refusal", name, err)
		}
	}
}
