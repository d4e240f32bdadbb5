package samples

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/internal/natstest"
)

// TestAppUserPermissionsSample gives an app's NATS user the permissions
// docs/integration.md lists, on a server of its own: the user answers the
// gateway's questions on greendot.authz.app.decide, publishes
// invalidations, and may do nothing else.
func TestAppUserPermissionsSample(t *testing.T) {
	perms := doctest.Sample(t, "docs/integration.md", "allow_responses = true")
	conf := filepath.Join(t.TempDir(), "nats.conf")
	text := "authorization {\n  users = [\n    {user: gateway, password: gateway-pw}\n    {user: app, password: app-pw\n" +
		perms.Text + "    }\n  ]\n}\n"
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("%s in a user's entry: %v\n%s", perms, err, text)
	}
	srv := natstest.RunServerWithOptions(t, opts)
	var (
		mu         sync.Mutex
		violations []string
	)
	app := natstest.Connect(t, srv, nats.UserInfo("app", "app-pw"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		defer mu.Unlock()
		violations = append(violations, err.Error())
	}))
	gw := natstest.Connect(t, srv, nats.UserInfo("gateway", "gateway-pw"))

	// The app answers a question.
	if _, err := app.Subscribe("greendot.authz.app.decide", func(m *nats.Msg) { _ = m.Respond([]byte(`{"allow":[]}`)) }); err != nil {
		t.Fatal(err)
	}
	if err := app.Flush(); err != nil {
		t.Fatal(err)
	}
	if reply, err := gw.Request("greendot.authz.app.decide", []byte(`{"watcher":"alice","targets":["bob"]}`), 5*time.Second); err != nil || string(reply.Data) != `{"allow":[]}` {
		t.Errorf("a question to the app: %v, %v", reply, err)
	}
	// It invalidates, and publishes nothing else.
	heard, err := gw.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{"presence.event.alice", "greendot.authz.invalidate"} {
		if err := app.Publish(subject, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := heard.NextMsg(5 * time.Second)
	if err != nil || m.Subject != "greendot.authz.invalidate" {
		t.Errorf("the gateway heard %v, %v; want only the invalidation", m, err)
	}
	// Nor may it listen elsewhere.
	if _, err := app.SubscribeSync("presence.event.>"); err != nil {
		t.Fatal(err)
	}
	if err := app.Flush(); err != nil && !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		all := strings.ToLower(strings.Join(violations, "\n"))
		if !strings.Contains(all, `publish to "presence.event.alice"`) || !strings.Contains(all, `subscription to "presence.event.>"`) {
			return errors.New("permission violations so far: " + all)
		}
		return nil
	})
}
