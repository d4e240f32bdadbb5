package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// TestJWTKeyRotation rotates the signing key of a gateway that reads its
// keys from a provider's JWK Set URL (--jwt-keys): the new key is taken
// once published, the old one is refused once removed, and a socket that
// connected with the old key is not dropped.
func TestJWTKeyRotation(t *testing.T) {
	t.Parallel()
	type key struct {
		kid  string
		pub  ed25519.PublicKey
		priv ed25519.PrivateKey
	}
	newKey := func(kid string) key {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return key{kid, pub, priv}
	}
	oldKey, nextKey := newKey("2026-11"), newKey("2026-12")
	var doc atomic.Pointer[[]byte]
	publish := func(keys ...key) {
		var set jose.JSONWebKeySet
		for _, k := range keys {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.pub, KeyID: k.kid, Use: "sig", Algorithm: "EdDSA"})
		}
		b, err := json.Marshal(set)
		if err != nil {
			t.Fatal(err)
		}
		doc.Store(&b)
	}
	publish(oldKey)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(*doc.Load())
	}))
	defer provider.Close()
	token := func(user string, k key) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.RegisteredClaims{Subject: user, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))})
		tok.Header["kid"] = k.kid
		s, err := tok.SignedString(k.priv)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	bearer := func(tok string) client.Options {
		return client.Options{Header: http.Header{"Authorization": {"Bearer " + tok}}}
	}
	// refused dials with tok and returns nil when the gateway answers 401.
	refused := func(url, tok string) error {
		c, err := client.Dial(context.Background(), url, bearer(tok))
		if err == nil {
			_ = c.Close()
			return errors.New("accepted")
		}
		if he := (*client.HandshakeError)(nil); !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
			return fmt.Errorf("dial: %v, want 401", err)
		}
		return nil
	}

	srv := natstest.RunServer(t)
	gwAddr := freeAddr(t)
	gw := start(t, append([]string{"gateway", "--nats-url", srv.ClientURL(), "--listen", gwAddr, "--policy", "everyone",
		"--jwt-keys", provider.URL + "/.well-known/jwks.json", "--jwt-keys-refresh", "300ms"}, fast...)...)
	url := "ws://" + gwAddr + "/ws"
	natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if code, body := getQuiet("http://" + gwAddr + "/readyz"); code != http.StatusOK {
			return &statusError{code, body}
		}
		return nil
	})

	alice := dial(t, url, bearer(token("alice", oldKey)))
	defer systest.KeepAlive(alice, 300*time.Millisecond)()
	if err := refused(url, token("bob", nextKey)); err != nil {
		t.Fatalf("bob, signed by a key not published yet: %v", err)
	}

	// The next key is published beside the old one.
	publish(oldKey, nextKey)
	var bob *client.Conn
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		c, err := client.Dial(context.Background(), url, bearer(token("bob", nextKey)))
		bob = c
		return err
	})
	defer systest.KeepAlive(bob, 300*time.Millisecond)()
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Online)

	// The old key is removed: new sockets signed by it are refused, and
	// alice's, open since before, goes on.
	publish(nextKey)
	natstest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		return refused(url, token("carol", oldKey))
	})
	if err := bob.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Busy)

	if code := gw.stop(t); code != 0 {
		t.Errorf("greendot gateway: exit code %d, want 0; stderr:\n%s", code, gw.stderr)
	}
	for _, want := range []string{"jwt key set read", "kids=2026-11,2026-12", "kids=2026-12\n"} {
		if !strings.Contains(gw.stderr.String(), want) {
			t.Errorf("the gateway's log lacks %q, which tells the key set's changes:\n%s", want, gw.stderr)
		}
	}
}
