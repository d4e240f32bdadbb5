package gateway_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// watchToken returns a valid token for sub whose watch claim is watch
// (any JSON value).
func watchToken(tb testing.TB, sub string, watch any) string {
	tb.Helper()
	return secSign(tb, jwt.SigningMethodHS256, secSecret, jwt.MapClaims{
		"sub":   sub,
		"exp":   time.Now().Add(time.Hour).Unix(),
		"watch": watch,
	})
}

// dialToken connects to g with token; the socket is aborted when the test
// ends.
func dialToken(tb testing.TB, g *systest.Gateway, token string) *client.Conn {
	tb.Helper()
	c, err := secDialErr(g.WS, bearer(token))
	if err != nil {
		tb.Fatalf("dial %s: %v", g.Addr, err)
	}
	tb.Cleanup(func() { _ = c.Abort() })
	return c
}

// subscribed is the answer to one subscribe: the presence_init and the
// reasons of the denied frames that follow it, by user.
type subscribed struct {
	init   protocol.ServerMessage
	denied map[string]string
}

// subscribeAll subscribes c to targets and reads the answer: presence_init,
// then a denied frame for every target it lacks.
func subscribeAll(tb testing.TB, c *client.Conn, id string, targets ...string) subscribed {
	tb.Helper()
	if err := c.Subscribe(id, targets...); err != nil {
		tb.Fatalf("subscribe: %v", err)
	}
	s := subscribed{denied: map[string]string{}}
	s.init = systest.Await(tb, c, 2*systest.EventTimeout, "presence_init "+id, func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == id
	})
	for range len(targets) - len(s.init.Users) {
		d := systest.Await(tb, c, systest.EventTimeout, "denied "+id, func(m protocol.ServerMessage) bool {
			return m.Type == protocol.TypeDenied && m.ID == id
		})
		s.denied[d.UserID] = d.Reason
	}
	return s
}

// users returns the ids of the users of a presence_init.
func (s subscribed) users() []string {
	var out []string
	for _, p := range s.init.Users {
		out = append(out, p.UserID)
	}
	return out
}

// awaitRevoked waits for the denied frame that ends c's subscription to
// user (no request id), and returns its reason.
func awaitRevoked(tb testing.TB, c *client.Conn, user string) string {
	tb.Helper()
	d := systest.Await(tb, c, 2*systest.EventTimeout, "denied "+user, func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypeDenied && m.ID == "" && m.UserID == user
	})
	return d.Reason
}

func TestTokenPolicyWatchClaim(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyToken, TokenMaxWatch: 3}})
	gw := sys.Gateway()
	for _, u := range []string{"bob", "carol"} {
		defer systest.KeepAlive(secDial(t, gw, u), systest.Heartbeat)()
	}
	// No follow edge anywhere: the token alone decides.
	a := dialToken(t, gw, watchToken(t, "alice", []string{"bob", "dave"}))
	defer systest.KeepAlive(a, systest.Heartbeat)()
	got := subscribeAll(t, a, "s", "bob", "carol")
	if u := got.users(); len(u) != 1 || u[0] != "bob" || got.init.Users[0].Status != presence.Online {
		t.Errorf("presence_init = %+v, want bob online", got.init)
	}
	if got.denied["carol"] != protocol.ReasonNotAllowed {
		t.Errorf("denied = %v, want carol not_allowed", got.denied)
	}

	t.Run("refresh replaces the list", func(t *testing.T) {
		if err := a.Send(protocol.ClientMessage{Type: protocol.TypeAuth, Token: watchToken(t, "alice", []string{"carol"})}); err != nil {
			t.Fatal(err)
		}
		if r := awaitRevoked(t, a, "bob"); r != protocol.ReasonNotAllowed {
			t.Errorf("bob revoked with %q, want not_allowed", r)
		}
		got := subscribeAll(t, a, "s2", "bob", "carol")
		if u := got.users(); len(u) != 1 || u[0] != "carol" {
			t.Errorf("after the refresh presence_init = %+v, want carol", got.init)
		}
	})

	t.Run("too large or malformed is refused at the handshake", func(t *testing.T) {
		_, err := secDialErr(gw.WS, bearer(watchToken(t, "alice", []string{"a", "b", "c", "d"})))
		body := refusedWith(t, err, http.StatusUnauthorized)
		for _, want := range []string{"lists 4 user ids", "at most 3", "--token-watch-max", "policy app"} {
			if !strings.Contains(body, want) {
				t.Errorf("refusal %q lacks %q", body, want)
			}
		}
		for _, bad := range []any{"bob", []any{1}, []string{"not an id!"}, map[string]any{"bob": true}} {
			_, err := secDialErr(gw.WS, bearer(watchToken(t, "alice", bad)))
			if body := refusedWith(t, err, http.StatusUnauthorized); !strings.Contains(body, "not a list of user ids") || !strings.Contains(body, "at most 3") {
				t.Errorf("watch %v: refusal %q does not name the watch claim and its limit", bad, body)
			}
		}
	})

	t.Run("a refresh with a too large list ends the socket", func(t *testing.T) {
		c := dialToken(t, gw, watchToken(t, "alice", []string{"bob"}))
		if err := c.Send(protocol.ClientMessage{Type: protocol.TypeAuth, Token: watchToken(t, "alice", []string{"a", "b", "c", "d"})}); err != nil {
			t.Fatal(err)
		}
		code, seen := awaitClose(t, c, systest.EventTimeout)
		if code != 1008 || len(seen) == 0 || !strings.Contains(seen[len(seen)-1].Message, "at most 3") {
			t.Errorf("closed with %d after %+v, want 1008 after an error naming the limit", code, seen)
		}
	})
}

func TestTokenPolicyHTTPAPI(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyToken, TokenMaxWatch: 3}})
	gw := sys.Gateway()
	for _, u := range []string{"bob", "carol"} {
		defer systest.KeepAlive(secDial(t, gw, u), systest.Heartbeat)()
	}
	// Bob shows last_seen to nobody; carol to her contacts, which alice,
	// whose token lists her, counts as.
	if err := sys.Store.SetSettings(t.Context(), "bob", presence.Settings{LastSeen: presence.Nobody}); err != nil {
		t.Fatal(err)
	}
	h := bearer(watchToken(t, "alice", []string{"bob", "carol"}))

	var p presence.Presence
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/carol", h, nil, &p); st != http.StatusOK || p.Status != presence.Online || p.LastSeen == 0 {
		t.Errorf("GET carol = %d %+v, want carol online with last_seen", st, p)
	}
	p = presence.Presence{}
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob", h, nil, &p); st != http.StatusOK || p.LastSeen != 0 {
		t.Errorf("GET bob = %d %+v, want bob without last_seen", st, p)
	}
	var e apiErr
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/dave", h, nil, &e); st != http.StatusForbidden || e.Error != protocol.ReasonNotAllowed {
		t.Errorf("GET dave = %d %+v, want 403 not_allowed", st, e)
	}
	var q queryAnswer
	if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", h, map[string]any{"user_ids": []string{"bob", "dave"}}, &q); st != http.StatusOK ||
		len(q.Users) != 1 || q.Users[0].UserID != "bob" || len(q.Denied) != 1 || q.Denied[0].Reason != protocol.ReasonNotAllowed {
		t.Errorf("POST query = %d %+v, want bob, and dave not_allowed", st, q)
	}
	var f struct{ Friends []presence.Presence }
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/friends", h, nil, &f); st != http.StatusOK || len(f.Friends) != 2 {
		t.Errorf("GET friends = %d %+v, want bob and carol", st, f)
	}
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/online", h, nil, &e); st != http.StatusForbidden {
		t.Errorf("GET online = %d, want 403", st)
	}
	// A token with no watch claim watches nobody but itself.
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob", bearer(secLongToken(t, "alice")), nil, &e); st != http.StatusForbidden {
		t.Errorf("GET bob without a claim = %d, want 403", st)
	}
	e = apiErr{}
	big := bearer(watchToken(t, "alice", []string{"a", "b", "c", "d"}))
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/a", big, nil, &e); st != http.StatusUnauthorized ||
		!strings.Contains(e.Message, "at most 3") || !strings.Contains(e.Message, "policy app") {
		t.Errorf("GET with a too large claim = %d %+v, want 401 naming the limit and the app policy", st, e)
	}
}
