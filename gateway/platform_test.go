package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// TestPlatforms: a watcher sees on which platforms the user is live and
// active, in presence_init, presence_batch and the HTTP API; a platform
// that goes idle or closes is seen to, and an invisible user shows none.
func TestPlatforms(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	dial := func(query string) *client.Conn {
		t.Helper()
		c, err := client.Dial(context.Background(), gw.WS+query, client.Options{})
		if err != nil {
			t.Fatalf("dial %s: %v", query, err)
		}
		t.Cleanup(func() { _ = c.Abort() })
		return c
	}
	platforms := func(p presence.Presence) string {
		t.Helper()
		b, err := json.Marshal(p.Platforms)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// await reads alice's frames until bob's presence says status on
	// platforms (JSON), and checks the HTTP API says the same.
	await := func(a *client.Conn, status presence.Status, want string) {
		t.Helper()
		var last presence.Presence
		systest.Await(t, a, systest.EventTimeout, "bob "+string(status)+" on "+want, func(m protocol.ServerMessage) bool {
			p, ok := presenceOf(m, "bob")
			if ok {
				last = p
			}
			return ok && p.Status == status && platforms(p) == want
		})
		var api presence.Presence
		if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob?user=alice", nil, nil, &api); st != http.StatusOK {
			t.Fatalf("GET users/bob: %d", st)
		}
		if api.Status != status || platforms(api) != want {
			t.Errorf("GET users/bob = %+v (platforms %s), want %s on %s; the socket saw %+v", api, platforms(api), status, want, last)
		}
	}

	web := dial("?user=bob&platform=web&device=laptop")
	alice := dial("?user=alice")
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	await(alice, presence.Online, `{"web":"active"}`)

	phone := dial("?user=bob&platform=mobile")
	await(alice, presence.Online, `{"web":"active","mobile":"active"}`)
	if err := phone.Send(protocol.ClientMessage{Type: protocol.TypeIdle}); err != nil {
		t.Fatal(err)
	}
	await(alice, presence.Online, `{"web":"active","mobile":"idle"}`)

	// A device that names no platform is in no entry.
	dial("?user=bob")
	rec, err := sys.StatusOf("bob")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(rec.Platforms); string(b) != `{"web":"active","mobile":"idle"}` || rec.Devices != 3 {
		t.Errorf("bob's record: %d devices on %s, want 3 on web (active) and mobile (idle)", rec.Devices, b)
	}

	if err := phone.Close(); err != nil {
		t.Fatal(err)
	}
	await(alice, presence.Online, `{"web":"active"}`)

	if err := web.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	await(alice, presence.Offline, `{}`)
	if err := web.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	await(alice, presence.Busy, `{"web":"active"}`)
}
