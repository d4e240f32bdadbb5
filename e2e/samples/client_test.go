package samples

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// testLog is the sample's log, on the test's.
type testLog struct{ t *testing.T }

func (l testLog) Printf(format string, args ...any) { l.t.Logf(format, args...) }

// runClientSample is the Go client sample of docs/integration.md, line for
// line, with the test's gateway in place of the page's; it returns why
// the client stopped.
func runClientSample(ctx context.Context, t *testing.T, gw *systest.Gateway, token string, show func(string, presence.Status, int64)) error {
	log := testLog{t}
	c, err := client.Connect(ctx, gw.WS, client.Config{
		Token:  token,     // a JWT whose sub is the user id; or TokenFunc, called per connection and to renew
		Device: "desktop", // optional; User: "alice" instead of a token on a dev auth gateway
	})
	if err != nil {
		return err // a 401 or 403 wraps client.ErrRefused and is not retried
	}
	defer c.Close()

	c.Subscribe("alice", "bob") // watched until Unsubscribe, or until denied
	c.SetStatus(presence.Busy)  // online, away, busy or invisible
	c.SetCustomStatus(&presence.Custom{Text: "In a meeting", Emoji: "📅", ExpiresAt: time.Now().Add(time.Hour).Unix()})

	for ev := range c.Events() { // closed when the client stops; c.Err() says why
		switch ev := ev.(type) {
		case client.Snapshot: // the answer to Subscribe (presence_init)
			for _, p := range ev.Users {
				show(p.UserID, p.Status, p.LastSeen)
			}
		case client.Changes: // presence_batch
			for _, p := range ev.Updates {
				show(p.UserID, p.Status, p.LastSeen)
			}
		case client.Denied:
			log.Printf("may not watch %s: %s", ev.UserID, ev.Reason)
		case client.Disconnected:
			log.Printf("lost: %v; retrying in %v", ev.Err, ev.Retry)
		case client.Reconnected:
			log.Printf("back after %v", ev.Down)
		}
	}
	return c.Err()
}

// TestGoClientSample runs the Go client sample of docs/integration.md as
// alice, with a token that expires a few seconds later: she shows busy to
// herself and sees bob online, until the gateway ends her connection at
// the token's expiry, which a client without TokenFunc does not retry,
// and the events end.
func TestGoClientSample(t *testing.T) {
	doctest.Verbatim(t, doctest.Sample(t, "docs/integration.md", "c, err := client.Connect(ctx,"), "client_test.go",
		`"wss://presence.example.com/ws"`, "gw.WS")
	secret := []byte("the JWT secret of the Go client sample")
	tokens, err := auth.New(auth.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	sign := func(user string, exp time.Time) string {
		token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: user, ExpiresAt: jwt.NewNumericDate(exp)}).SignedString(secret)
		if err != nil {
			t.Fatal(err)
		}
		return token
	}
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Tokens: tokens}})
	sys.Mutual("alice", "bob")
	gw := sys.Gateway()
	bob, err := client.Dial(context.Background(), gw.WS, client.Options{Header: http.Header{"Authorization": {"Bearer " + sign("bob", time.Now().Add(time.Hour))}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = bob.Abort() }()
	defer systest.KeepAlive(bob, systest.Heartbeat)()

	var (
		mu    sync.Mutex
		shown = map[string]presence.Status{}
	)
	show := func(user string, status presence.Status, _ int64) {
		mu.Lock()
		defer mu.Unlock()
		shown[user] = status
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := runClientSample(ctx, t, gw, sign("alice", time.Now().Add(4*time.Second)), show); !errors.Is(err, client.ErrRefused) {
		t.Errorf("the events ended with %v, want the refusal of the expired token", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if shown["alice"] != presence.Busy || shown["bob"] != presence.Online {
		t.Errorf("the sample showed %v, want alice busy and bob online", shown)
	}
}
