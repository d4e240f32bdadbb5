package gateway_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

const (
	readerKey = "gdk_reader_0123456789abcdef"
	writerKey = "gdk_writer_0123456789abcdef"
	nextKey   = "gdk_next_0123456789abcdefgh"
)

// TestServerAPI: a backend with an API key reads any user's presence
// (last_seen whatever the user's privacy) and any room's members, and
// sets a user's status and custom status, which watchers and the user's
// own devices see; each scope is needed for what it allows, and every
// bad input is refused with its reason.
func TestServerAPI(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "api-keys")
	if err := os.WriteFile(path, []byte("reader presence:read "+readerKey+"\nwriter status:write "+writerKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{APIKeysFile: path}})
	gw := sys.Gateway()
	api := gw.HTTP + gateway.ServerAPIPrefix
	sys.Mutual("alice", "bob")
	if err := sys.Store.SetSettings(context.Background(), "bob", presence.Settings{LastSeen: presence.Nobody}); err != nil {
		t.Fatal(err)
	}

	// Who may call what.
	var e struct{ Error, Message string }
	for _, tc := range []struct {
		name, method, path string
		h                  http.Header
		body               any
		status             int
		code               string
	}{
		{"no key", "GET", "users/bob", nil, nil, http.StatusUnauthorized, protocol.CodeUnauthorized},
		{"unknown key", "GET", "users/bob", bearer("gdk_nobody_0123456789abcdef"), nil, http.StatusUnauthorized, protocol.CodeUnauthorized},
		{"a user's dev auth", "GET", "users/bob?user=alice", nil, nil, http.StatusUnauthorized, protocol.CodeUnauthorized},
		{"writer reads", "GET", "users/bob", bearer(writerKey), nil, http.StatusForbidden, protocol.ReasonNotAllowed},
		{"reader writes", "PUT", "users/bob/status", bearer(readerKey), map[string]string{"status": "busy"}, http.StatusForbidden, protocol.ReasonNotAllowed},
		{"bad user id", "GET", "users/b%20b", bearer(readerKey), nil, http.StatusBadRequest, protocol.ReasonInvalidUserID},
		{"bad room", "GET", "rooms/a%20b", bearer(readerKey), nil, http.StatusBadRequest, protocol.ReasonInvalidRoom},
		{"query without ids", "POST", "query", bearer(readerKey), map[string]any{}, http.StatusBadRequest, protocol.CodeBadRequest},
		{"query of too many", "POST", "query", bearer(readerKey), map[string]any{"user_ids": make([]string, 501)}, http.StatusBadRequest, protocol.CodeBadRequest},
		{"bad status", "PUT", "users/bob/status", bearer(writerKey), map[string]string{"status": "offline"}, http.StatusBadRequest, protocol.CodeInvalidStatus},
		{"status not JSON", "PUT", "users/bob/status", bearer(writerKey), []byte("busy"), http.StatusBadRequest, protocol.CodeBadRequest},
		{"bad custom status", "PUT", "users/bob/custom_status", bearer(writerKey), map[string]any{"text": strings.Repeat("x", 101)}, http.StatusBadRequest, protocol.CodeInvalidCustom},
		{"custom status expired", "PUT", "users/bob/custom_status", bearer(writerKey), map[string]any{"text": "x", "expires_at": 1}, http.StatusBadRequest, protocol.CodeInvalidCustom},
		{"another method", "DELETE", "users/bob", bearer(readerKey), nil, http.StatusMethodNotAllowed, "method_not_allowed"},
	} {
		e.Error = ""
		if st := apiCall(t, tc.method, api+tc.path, tc.h, tc.body, &e); st != tc.status || e.Error != tc.code {
			t.Errorf("%s: %d %s (%s), want %d %s", tc.name, st, e.Error, e.Message, tc.status, tc.code)
		}
	}

	// Reads.
	var p presence.Presence
	if st := apiCall(t, "GET", api+"users/bob", bearer(readerKey), nil, &p); st != http.StatusOK || p.Status != presence.Offline {
		t.Errorf("bob, never seen: %d %+v", st, p)
	}
	bob := sys.Dial(gw, "bob")
	alice := sys.Dial(gw, "alice")
	defer systest.KeepAlive(bob, systest.Heartbeat)()
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Online)
	if st := apiCall(t, "GET", api+"users/bob", bearer(readerKey), nil, &p); st != http.StatusOK || p.Status != presence.Online || p.LastSeen == 0 {
		t.Errorf("bob online, last_seen hidden from watchers: %d %+v, want online with last_seen", st, p)
	}
	var q struct{ Users []presence.Presence }
	if st := apiCall(t, "POST", api+"query", bearer(readerKey), map[string]any{"user_ids": []string{"bob", "carol"}}, &q); st != http.StatusOK || len(q.Users) != 2 ||
		q.Users[0].Status != presence.Online || q.Users[1].Status != presence.Offline {
		t.Errorf("query bob and carol: %d %+v", st, q)
	}
	if err := bob.Send(protocol.ClientMessage{Type: protocol.TypeJoin, ID: "j", Room: "doc:1"}); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, bob, systest.EventTimeout, "room_state", func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeRoomState })
	var room protocol.RoomState
	if st := apiCall(t, "GET", api+"rooms/doc:1", bearer(readerKey), nil, &room); st != http.StatusOK || room.Count != 1 || len(room.Members) != 1 || room.Members[0].UserID != "bob" {
		t.Errorf("room doc:1: %d %+v, want bob in it", st, room)
	}

	// Writes: a call service says bob is busy, in a call.
	if st := apiCall(t, "PUT", api+"users/bob/status", bearer(writerKey), map[string]string{"status": "busy"}, &p); st != http.StatusOK || p.Status != presence.Busy {
		t.Errorf("PUT bob busy: %d %+v", st, p)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Busy)
	systest.AwaitSelf(t, bob, presence.Busy, 1)
	call := &presence.Custom{Text: "In a call", Emoji: "📞", ExpiresAt: time.Now().Add(time.Hour).Unix()}
	if st := apiCall(t, "PUT", api+"users/bob/custom_status", bearer(writerKey), call, &p); st != http.StatusOK || !p.Custom.Equal(call) {
		t.Errorf("PUT bob's custom status: %d %+v", st, p)
	}
	awaitCustom(t, alice, "bob", presence.Busy, call)
	p = presence.Presence{}
	if st := apiCall(t, "PUT", api+"users/bob/custom_status", bearer(writerKey), map[string]any{}, &p); st != http.StatusOK || p.Custom != nil {
		t.Errorf("PUT bob's custom status {}: %d %+v", st, p)
	}
	awaitCustom(t, alice, "bob", presence.Busy, nil)
	// A user offline: the choice waits in the record, as the user's own would.
	p = presence.Presence{}
	if st := apiCall(t, "PUT", api+"users/carol/status", bearer(writerKey), map[string]string{"status": "away"}, &p); st != http.StatusOK || p.Status != presence.Offline {
		t.Errorf("PUT carol away: %d %+v, want her offline still", st, p)
	}
	carol := sys.Dial(gw, "carol")
	systest.AwaitSelf(t, carol, presence.Away, 1)
}

// TestServerAPIKeys: keys rotate without a restart (a key added to the
// file is taken, one removed refused), each key has a rate limit of its
// own, apart from users', and a bad file at the start stops the gateway
// with the reason.
func TestServerAPIKeys(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "api-keys")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(path+".new", []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	write("reader presence:read " + readerKey + "\nwriter status:write " + writerKey + "\n")
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{APIKeysFile: path, APIKeysRefresh: 50 * time.Millisecond, APIKeyRateLimit: 0.5, APIKeyRateBurst: 3}})
	gw := sys.Gateway()
	api := gw.HTTP + gateway.ServerAPIPrefix

	// The rate limit of one key does not hold another up, nor the users.
	for i := range 3 {
		if st := apiCall(t, "GET", api+"users/bob", bearer(readerKey), nil, nil); st != http.StatusOK {
			t.Fatalf("request %d: %d", i, st)
		}
	}
	st, h := apiCallHeader(t, "GET", api+"users/bob", bearer(readerKey), nil, nil)
	if st != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Errorf("fourth request at once: %d, Retry-After %q; want 429 with Retry-After", st, h.Get("Retry-After"))
	}
	if st := apiCall(t, "PUT", api+"users/bob/status", bearer(writerKey), map[string]string{"status": "busy"}, nil); st != http.StatusOK {
		t.Errorf("another key while the first is limited: %d", st)
	}
	if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob?user=bob", nil, nil, nil); st != http.StatusOK {
		t.Errorf("a user while a key is limited: %d", st)
	}

	// Rotation: the next key beside the old one, then the old one gone.
	write("reader presence:read " + readerKey + "\nwriter status:write " + writerKey + "\nnext presence:read " + nextKey + "\n")
	awaitCode(t, api+"users/bob", nextKey, http.StatusOK)
	write("writer status:write " + writerKey + "\nnext presence:read " + nextKey + "\n")
	awaitCode(t, api+"users/bob", readerKey, http.StatusUnauthorized)
	// A bad file keeps the keys before it.
	write("next presence:read short\n")
	if st := apiCall(t, "GET", api+"users/bob", bearer(nextKey), nil, nil); st != http.StatusOK && st != http.StatusTooManyRequests {
		t.Errorf("after a bad file: %d, want the key still taken", st)
	}

	// A bad file at the start: the gateway does not start, and says why.
	bad := filepath.Join(t.TempDir(), "bad-keys")
	if err := os.WriteFile(bad, []byte("reader presence:write "+readerKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(sys.NC, gateway.Config{DevAuth: true, APIKeysFile: bad})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Serve(context.Background(), ln); err == nil || !strings.Contains(err.Error(), `scope "presence:write"`) {
		t.Errorf("Serve with a bad API keys file: %v", err)
	}
}

// awaitCode asks url with key until it is answered status (a key file
// read again), or fails the test after a few seconds.
func awaitCode(t *testing.T, url, key string, status int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := apiCall(t, "GET", url, bearer(key), nil, nil)
		if st == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s with key %s: %d, want %d", url, key[:10], st, status)
		}
		time.Sleep(20 * time.Millisecond) // polling the file's reload, bounded by deadline
	}
}
