package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// The tests of this file run a gateway that takes only JWTs, signed here
// with renewSecret, and give alice tokens that last tokenLife: long
// enough for a loaded machine to renew them in time, short enough to see
// several of them expire.

// renewSecret is the HS256 secret of the tokens.
var renewSecret = []byte("greendot client renewal tests: a secret of 32+ bytes")

// tokenLife is how long alice's tokens last; their exp is in whole
// seconds, so up to a second less.
const tokenLife = 5 * time.Second

// startWithTokens runs a system whose gateway takes only tokens signed
// with renewSecret, in which alice and bob follow each other.
func startWithTokens(t *testing.T) *systest.System {
	t.Helper()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Tokens: renewVerifier(t)}})
	sys.Mutual("alice", "bob")
	return sys
}

// renewVerifier returns the verifier of the gateways under test.
func renewVerifier(t *testing.T) gateway.TokenVerifier {
	t.Helper()
	v, err := auth.New(auth.Config{Secret: renewSecret})
	if err != nil {
		t.Fatalf("verifier: %v", err)
	}
	return v
}

// signToken returns a token for sub that expires at exp.
func signToken(sub string, exp time.Time) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Subject:   sub,
		ExpiresAt: jwt.NewNumericDate(exp),
	}).SignedString(renewSecret)
}

// issued is a token an issuer handed out.
type issued struct {
	token string
	exp   time.Time
}

// issuer is alice's TokenFunc: every call gets a fresh token lasting
// tokenLife, unless instead answers it.
type issuer struct {
	// instead holds answers given in place of a fresh token, by the
	// number of the call (1 for the first).
	instead map[int]answer

	mu     sync.Mutex
	calls  int
	tokens []issued // the fresh tokens handed out, in order
}

func (is *issuer) token(context.Context) (string, error) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.calls++
	if a, ok := is.instead[is.calls]; ok {
		return a.token, a.err
	}
	exp := time.Now().Add(tokenLife)
	tok, err := signToken("alice", exp)
	if err != nil {
		return "", err
	}
	is.tokens = append(is.tokens, issued{tok, exp.Truncate(time.Second)})
	return tok, nil
}

// answer is what a TokenFunc returns.
type answer struct {
	token string
	err   error
}

// count returns how many times the issuer was called.
func (is *issuer) count() int {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.calls
}

// fresh returns the i-th fresh token handed out (0 for the first).
func (is *issuer) fresh(i int) issued {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.tokens[i]
}

// connectWith connects the client named name to g with cfg; it is closed
// when the test ends.
func connectWith(t *testing.T, g *systest.Gateway, name string, cfg client.Config) *events {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := client.Connect(ctx, g.WS, cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &events{t: t, c: c, name: name}
}

// aliceWatchesBob connects alice with cfg and bob with a token that
// outlives the test, and returns once alice sees bob online.
func aliceWatchesBob(t *testing.T, g *systest.Gateway, cfg client.Config) (alice, bob *events) {
	t.Helper()
	long, err := signToken("bob", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	alice = connectWith(t, g, "alice", cfg)
	bob = connectWith(t, g, "bob", client.Config{Token: long})
	if err := alice.c.Subscribe("bob"); err != nil {
		t.Fatal(err)
	}
	alice.awaitStatus("bob", presence.Online)
	return alice, bob
}

// bobChanges has bob choose status and waits until alice sees it: her
// subscription still delivers.
func bobChanges(alice, bob *events, status presence.Status) {
	alice.t.Helper()
	if err := bob.c.SetStatus(status); err != nil {
		alice.t.Fatal(err)
	}
	alice.awaitStatus("bob", status)
}

// connectFixed connects a second client of alice's with token, which it
// never renews, so that awaitExpired can tell when the gateway saw token
// expire.
func connectFixed(t *testing.T, g *systest.Gateway, token string) *events {
	t.Helper()
	return connectWith(t, g, "alice's fixed", client.Config{Token: token, Device: "fixed"})
}

// awaitExpired waits until the gateway closes fixed as expired: its sweep
// has then seen fixed's token expire, and would have closed any other
// connection that still used that token.
func awaitExpired(t *testing.T, fixed *events) {
	t.Helper()
	select {
	case <-fixed.c.Done():
	case <-time.After(waitFor):
		t.Fatalf("the connection with a fixed token still runs after %v", waitFor)
	}
	var ce *client.CloseError
	if err := fixed.c.Err(); !errors.As(err, &ce) || ce.Code != protocol.ClosePolicy || ce.Reason != "token expired" {
		t.Fatalf("fixed token: Err() = %v, want 1008 token expired", err)
	}
}

// checkNeverReconnected fails the test if alice's client lost its first
// connection.
func checkNeverReconnected(t *testing.T, alice *events, connID string) {
	t.Helper()
	alice.drain()
	for _, ev := range alice.seen {
		if isType[client.Disconnected](ev) || isType[client.Reconnected](ev) {
			t.Fatalf("alice's connection was replaced: %s", describe(alice.seen))
		}
	}
	if n := alice.c.Stats().Reconnects; n != 0 {
		t.Errorf("%d reconnects, want none", n)
	}
	if id := alice.c.Hello().ConnID; id != connID {
		t.Errorf("connection %s, want the first one, %s", id, connID)
	}
}

// TestTokenRenewedInPlace gives alice tokens that last a few seconds,
// from a TokenFunc: the client renews them on the open connection, which
// outlives several of them, and her subscription keeps delivering.
func TestTokenRenewedInPlace(t *testing.T) {
	t.Parallel()
	sys := startWithTokens(t)
	g := sys.Gateway()
	is := &issuer{}
	cfg := fast
	cfg.TokenFunc = is.token
	alice, bob := aliceWatchesBob(t, g, cfg)
	connID := alice.c.Hello().ConnID
	fixed := connectFixed(t, g, is.fresh(0).token)

	// Three renewals, each seen to leave the subscription working.
	for n := 2; n <= 4; n++ {
		natstest.CheckFor(t, waitFor, 20*time.Millisecond, func() error {
			if got := is.count(); got < n {
				return fmt.Errorf("%d tokens asked for, want %d", got, n)
			}
			return nil
		})
		bobChanges(alice, bob, []presence.Status{presence.Busy, presence.Online}[n%2])
	}
	awaitExpired(t, fixed)
	if second := is.fresh(1).exp; time.Now().Before(second) {
		t.Fatalf("four tokens asked for before the second expired at %v", second)
	}
	bobChanges(alice, bob, presence.Online)
	checkNeverReconnected(t, alice, connID)
}

// TestTokenRenewalRetriesAfterFailure: the TokenFunc fails twice when
// the client first renews; the client tries again, renews in place, and
// the connection outlives its first token.
func TestTokenRenewalRetriesAfterFailure(t *testing.T) {
	t.Parallel()
	sys := startWithTokens(t)
	g := sys.Gateway()
	down := answer{err: errors.New("the token service is down")}
	is := &issuer{instead: map[int]answer{2: down, 3: down}}
	cfg := fast
	cfg.TokenFunc = is.token
	alice, bob := aliceWatchesBob(t, g, cfg)
	connID := alice.c.Hello().ConnID
	fixed := connectFixed(t, g, is.fresh(0).token)

	awaitExpired(t, fixed)
	bobChanges(alice, bob, presence.Busy)
	if n := is.count(); n < 4 {
		t.Fatalf("%d tokens asked for, want the two failures and a renewal after them", n)
	}
	checkNeverReconnected(t, alice, connID)
}

// TestRefusedRenewalReconnects: the gateway refuses a renewed token
// (error unauthorized, close 1008): the client opens a new connection
// with a token from its TokenFunc, instead of stopping, and subscribes
// again.
func TestRefusedRenewalReconnects(t *testing.T) {
	t.Parallel()
	sys := startWithTokens(t)
	g := sys.Gateway()
	is := &issuer{instead: map[int]answer{2: {token: "not-a-jwt"}}}
	cfg := fast
	cfg.TokenFunc = is.token
	alice, bob := aliceWatchesBob(t, g, cfg)

	refusal := alice.await("unauthorized", isType[client.ServerError]).(client.ServerError)
	if refusal.Code != protocol.CodeUnauthorized {
		t.Fatalf("error %+v, want unauthorized", refusal.Error)
	}
	d := alice.await("disconnected", isType[client.Disconnected]).(client.Disconnected)
	var ce *client.CloseError
	if !errors.As(d.Err, &ce) || ce.Code != protocol.ClosePolicy || ce.Reason != "unauthorized" {
		t.Fatalf("disconnected by %v, want 1008 unauthorized", d.Err)
	}
	alice.await("reconnected", isType[client.Reconnected])
	bobChanges(alice, bob, presence.Busy)
	if err := alice.c.Err(); err != nil {
		t.Fatalf("Err() = %v, want the client running", err)
	}
}

// TestSetTokenRenewsInPlace: alice connects with a fixed token that
// lasts a few seconds and gives a longer one with SetToken. The open
// connection outlives the first token, and a later connection opens with
// the new one.
func TestSetTokenRenewsInPlace(t *testing.T) {
	t.Parallel()
	sys := startWithTokens(t)
	g := sys.Gateway()
	short, err := signToken("alice", time.Now().Add(tokenLife))
	if err != nil {
		t.Fatal(err)
	}
	long, err := signToken("alice", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	alice, bob := aliceWatchesBob(t, g, client.Config{Token: short, Backoff: fast.Backoff})
	connID := alice.c.Hello().ConnID
	fixed := connectFixed(t, g, short)
	if err := alice.c.SetToken(""); err == nil {
		t.Error("SetToken took an empty token")
	}
	if err := alice.c.SetToken(long); err != nil {
		t.Fatal(err)
	}

	awaitExpired(t, fixed)
	bobChanges(alice, bob, presence.Busy)
	checkNeverReconnected(t, alice, connID)

	// The gateway restarts: alice comes back with the token SetToken
	// gave, as the first one would be refused with 401.
	sys.StopGateway(g)
	sys.StartGatewayAt(gateway.Config{Tokens: renewVerifier(t)}, g.Addr)
	alice.await("reconnected", isType[client.Reconnected])
	bobChanges(alice, bob, presence.Online)
}

// TestStaleTokenIsNotSent: a TokenFunc that keeps returning the token in
// use (from a cache, say) until it expires does not renew it. The client
// sends no auth message with it, and tries again with a backoff instead
// of ever sooner as the expiry nears; the gateway closes the connection
// as expired, and the client opens a new one with a fresh token.
func TestStaleTokenIsNotSent(t *testing.T) {
	sys := startWithTokens(t)
	g := sys.Gateway()
	exp := time.Now().Add(tokenLife)
	cached, err := signToken("alice", exp)
	if err != nil {
		t.Fatal(err)
	}
	exp = exp.Truncate(time.Second)
	cfg := fast
	cfg.TokenFunc = func(context.Context) (string, error) {
		if time.Now().Before(exp) {
			return cached, nil
		}
		return signToken("alice", time.Now().Add(time.Hour))
	}
	alice, bob := aliceWatchesBob(t, g, cfg)

	d := alice.await("disconnected", isType[client.Disconnected]).(client.Disconnected)
	var ce *client.CloseError
	if !errors.As(d.Err, &ce) || ce.Code != protocol.ClosePolicy || ce.Reason != "token expired" {
		t.Fatalf("disconnected by %v, want 1008 token expired", d.Err)
	}
	alice.await("reconnected", isType[client.Reconnected])
	bobChanges(alice, bob, presence.Busy)
	if n, _ := metricstest.Value(g.Registry(), "greendot_gateway_messages_received_total", "type", protocol.TypeAuth); n != 0 {
		t.Errorf("the gateway received %v auth messages, want none", n)
	}
}

// TestSetTokenNeedsTokens: a client with dev auth has no token to renew;
// SetToken refuses and sends nothing, and the connection stays.
func TestSetTokenNeedsTokens(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	g := sys.Gateway()
	alice := connect(t, g, "alice", client.Config{})
	if err := alice.c.SetToken("a.b.c"); err == nil {
		t.Fatal("SetToken took a token on a client with dev auth")
	}
	if err := alice.c.Subscribe("bob"); err != nil {
		t.Fatal(err)
	}
	alice.await("snapshot", isType[client.Snapshot])
	if n, _ := metricstest.Value(g.Registry(), "greendot_gateway_messages_received_total", "type", protocol.TypeAuth); n != 0 {
		t.Errorf("the gateway received %v auth messages, want none", n)
	}
	checkNeverReconnected(t, alice, alice.c.Hello().ConnID)
}
