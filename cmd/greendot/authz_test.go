package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/system/systest"
)

// TestStandaloneAppPolicy runs standalone with --policy app asking an HTTP
// endpoint that checks the signature made with the secret file's secret.
func TestStandaloneAppPolicy(t *testing.T) {
	t.Parallel()
	secret := "the app's shared secret, 32 bytes or more"
	secretFile := t.TempDir() + "/app-secret"
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var asked, badSigs atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if signature.Verify([]byte(secret), r.Header.Get(signature.Header), body, time.Now(), 0) != nil {
			badSigs.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		asked.Add(1)
		var q struct{ Targets []string }
		_ = json.Unmarshal(body, &q)
		allow := []string{}
		for _, u := range q.Targets {
			if u == "bob" {
				allow = append(allow, u)
			}
		}
		_ = json.NewEncoder(w).Encode(map[string][]string{"allow": allow})
	}))
	defer app.Close()

	p := start(t, "standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", "",
		"--policy", "app", "--authz-app-url", app.URL, "--authz-app-secret-file", secretFile, "--authz-app-timeout", "10s")
	m := p.awaitOutput(t, devReadyRE)
	c := dial(t, "ws://"+m[1]+"/ws?user=alice", client.Options{})
	if err := c.Subscribe("s", "bob", "carol"); err != nil {
		t.Fatal(err)
	}
	init := systest.Await(t, c, 10*time.Second, "presence_init", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit
	})
	d := systest.Await(t, c, 10*time.Second, "denied", func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeDenied })
	if len(init.Users) != 1 || init.Users[0].UserID != "bob" || d.UserID != "carol" || d.Reason != protocol.ReasonNotAllowed {
		t.Errorf("subscribe under --policy app = %+v then %+v, want bob, and carol not_allowed", init, d)
	}
	if asked.Load() != 1 || badSigs.Load() != 0 {
		t.Errorf("app asked %d times, %d bad signatures; want 1 and 0", asked.Load(), badSigs.Load())
	}
	if code := p.stop(t); code != 0 {
		t.Errorf("exit code %d; stderr:\n%s", code, p.stderr)
	}
}

// TestStandaloneConnectProxy runs standalone with --connect-proxy-url (and
// no other way in: its dev auth goes off) asking an HTTP endpoint that
// checks the signature made with the secret file's secret: a browser's
// session cookie and the header named in --connect-proxy-headers are
// forwarded, its user let in; ?user= is refused, the app not asked.
func TestStandaloneConnectProxy(t *testing.T) {
	t.Parallel()
	secret := "the app's shared secret, 32 bytes or more"
	secretFile := t.TempDir() + "/app-secret"
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var asked, badSigs atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if signature.Verify([]byte(secret), r.Header.Get(signature.Header), body, time.Now(), 0) != nil {
			badSigs.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		asked.Add(1)
		var q struct{ Headers map[string]string }
		_ = json.Unmarshal(body, &q)
		if q.Headers["Cookie"] != "sessionid=k1" || q.Headers["X-App"] != "web" {
			_ = json.NewEncoder(w).Encode(map[string]bool{"refuse": true})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"user_id": "alice", "expires_in": 3600})
	}))
	defer app.Close()

	p := start(t, "standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", "",
		"--connect-proxy-url", app.URL, "--connect-proxy-headers", "X-App", "--authz-app-secret-file", secretFile,
		"--allowed-origins", "https://app.example")
	m := p.awaitOutput(t, jwtReadyRE)
	if !strings.Contains(m[0], "session cookie") {
		t.Errorf("ready line %q does not say a session cookie is taken", m[0])
	}
	c := dial(t, "ws://"+m[1]+"/ws", client.Options{Header: http.Header{"Cookie": {"sessionid=k1"}, "X-App": {"web"}}})
	if c.Hello.UserID != "alice" {
		t.Errorf("hello = %+v, want alice", c.Hello)
	}
	_, err := client.Dial(context.Background(), "ws://"+m[1]+"/ws?user=mallory", client.Options{Timeout: 5 * time.Second})
	var he *client.HandshakeError
	if !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
		t.Errorf("?user= with the connect proxy: %v, want 401", err)
	}
	// ?user= is refused as without dev auth, the app not asked.
	if asked.Load() != 1 || badSigs.Load() != 0 {
		t.Errorf("app asked %d times, %d bad signatures; want 1 and 0", asked.Load(), badSigs.Load())
	}
	if code := p.stop(t); code != 0 {
		t.Errorf("exit code %d; stderr:\n%s", code, p.stderr)
	}
}
