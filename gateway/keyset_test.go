package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// keyProvider serves a JWK Set, as an identity provider's jwks_uri does;
// once held, it answers the next read only when released.
type keyProvider struct {
	*httptest.Server
	doc atomic.Pointer[[]byte]
	// held has the next read wait for release; asked is closed when it
	// waits.
	held    atomic.Bool
	asked   chan struct{}
	release func()
}

func newKeyProvider(t *testing.T) *keyProvider {
	p := &keyProvider{asked: make(chan struct{})}
	released := make(chan struct{})
	p.release = sync.OnceFunc(func() { close(released) })
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.held.CompareAndSwap(true, false) {
			close(p.asked)
			select {
			case <-released:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write(*p.doc.Load())
	}))
	t.Cleanup(p.Close)
	t.Cleanup(p.release)
	return p
}

// publish has the provider serve the public keys of keys, by kid.
func (p *keyProvider) publish(t *testing.T, keys map[string]*ecdsa.PrivateKey) {
	t.Helper()
	set := jose.JSONWebKeySet{}
	for kid, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.PublicKey, KeyID: kid, Algorithm: "ES256", Use: "sig"})
	}
	doc, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	p.doc.Store(&doc)
}

// roomsToken signs, with key under kid, a token for sub that allows rooms
// and outlives the test.
func roomsToken(t *testing.T, key *ecdsa.PrivateKey, kid, sub string, rooms []string) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, struct {
		jwt.RegisteredClaims
		Rooms []string `json:"rooms"`
	}{jwt.RegisteredClaims{Subject: sub, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}, rooms})
	tok.Header["kid"] = kid
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRenewalWaitingForKeysHoldsNoReader: a socket's auth renewal whose
// token names a key the gateway's key set lacks has the set read again.
// While the provider is slow to answer, the gateway's one read worker
// goes on reading every socket: the renewing socket's own set_status is
// written, another socket's subscribe answered. A join sent after the
// renewal is decided by the renewed token's rooms claim, once the keys
// are read.
func TestRenewalWaitingForKeysHoldsNoReader(t *testing.T) {
	t.Parallel()
	keyA, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keyB, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p := newKeyProvider(t)
	p.publish(t, map[string]*ecdsa.PrivateKey{"a": keyA})
	ks, err := auth.NewKeySet(context.Background(), auth.KeySetConfig{Source: p.URL, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	v, err := auth.New(auth.Config{Keys: ks})
	if err != nil {
		t.Fatal(err)
	}
	sys := secStart(t, systest.Options{Gateway: gateway.Config{Tokens: v, ReadWorkers: 1}})
	gw := sys.Gateway()
	alice, err := secDialErr(gw.WS, bearer(roomsToken(t, keyA, "a", "alice", nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = alice.Abort() })
	t.Cleanup(systest.KeepAlive(alice, systest.Heartbeat))
	bob, err := secDialErr(gw.WS, bearer(roomsToken(t, keyA, "a", "bob", nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bob.Abort() })
	t.Cleanup(systest.KeepAlive(bob, systest.Heartbeat))

	// Key b is published, and the read that finds it waits.
	p.publish(t, map[string]*ecdsa.PrivateKey{"a": keyA, "b": keyB})
	p.held.Store(true)
	for _, m := range []protocol.ClientMessage{
		{Type: protocol.TypeAuth, ID: "r", Token: roomsToken(t, keyB, "b", "alice", []string{"doc:1"})},
		{Type: protocol.TypeJoin, ID: "j", Room: "doc:1"},
		{Type: protocol.TypeSetStatus, Status: string(presence.Busy)},
	} {
		if err := alice.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-p.asked:
	case <-time.After(systest.EventTimeout):
		t.Fatal("the renewal naming kid b did not have the key set read")
	}
	systest.AwaitSelf(t, alice, presence.Busy, 1)
	subscribeSelf(t, bob, "while-the-keys-are-read")

	p.release()
	m := systest.Await(t, alice, systest.EventTimeout, "the answer to join j", func(m protocol.ServerMessage) bool { return m.ID == "j" })
	if m.Type != protocol.TypeRoomState {
		t.Fatalf("join after the renewal answered %+v, want room_state: the renewed token allows doc:1", m)
	}
	subscribeSelf(t, alice, "after-renewal")
}
