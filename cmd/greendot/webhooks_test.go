package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// TestWebhooksProcess runs greendot webhooks as its own command beside a
// reaper, fanout and gateway, with the secret in a file, and checks that a
// user's transitions reach the endpoint and that it serves its health and
// metrics.
func TestWebhooksProcess(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	natsURL := srv.ClientURL()
	secret := "the endpoint's signing secret"
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sink := systest.NewHookSink(t, []byte(secret))
	metrics, gwAddr := freeAddr(t), freeAddr(t)
	// Without presence_feed the process refuses to start, and says how to
	// create it.
	if code, _, stderr := runOnce(t, "webhooks", "--nats-url", natsURL, "--url", sink.URL, "--secret-file", secretFile); code != 1 ||
		!strings.Contains(stderr, "presence_feed") || !strings.Contains(stderr, "greendot buckets --feed") {
		t.Errorf("webhooks without presence_feed: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runOnce(t, "buckets", "--nats-url", natsURL, "--feed"); code != 0 {
		t.Fatalf("buckets --feed: exit %d; stderr:\n%s", code, stderr)
	}
	hooks := start(t, "webhooks", "--nats-url", natsURL, "--url", sink.URL, "--secret-file", secretFile,
		"--batch-wait", "10ms", "--metrics-listen", metrics)
	reaper := start(t, "reaper", "--nats-url", natsURL)
	gw := start(t, append([]string{"gateway", "--nats-url", natsURL, "--listen", gwAddr, "--dev-auth"}, fast...)...)
	// Both the webhooks process and the gateway serve before alice dials.
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		for _, addr := range []string{metrics, gwAddr} {
			if code, body := getQuiet("http://" + addr + "/readyz"); code != http.StatusOK {
				return &statusError{code, body}
			}
		}
		return nil
	})

	alice := dial(t, "ws://"+gwAddr+"/ws?user=alice", client.Options{})
	stop := systest.KeepAlive(alice, 300*time.Millisecond)
	sink.Await(t, "alice", presence.Online)
	if err := alice.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	sink.Await(t, "alice", presence.Busy)
	stop()
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	sink.Await(t, "alice", presence.Offline)

	if code, body := httpGet(t, "http://"+metrics+"/metrics"); code != http.StatusOK || !strings.Contains(body, "greendot_webhook_events_delivered_total") {
		t.Errorf("GET /metrics = %d, without greendot_webhook_events_delivered_total", code)
	}
	for _, p := range []*proc{gw, reaper, hooks} {
		if code := p.stop(t); code != 0 {
			t.Errorf("greendot %s: exit code %d, want 0; stderr:\n%s", p.args[0], code, p.stderr)
		}
	}
}

// TestStandaloneWebhooks: standalone mode with --webhook-url runs a
// webhooks process inside, configured from the environment too.
func TestStandaloneWebhooks(t *testing.T) {
	secret := "standalone's signing secret"
	sink := systest.NewHookSink(t, []byte(secret))
	t.Setenv("GREENDOT_WEBHOOK_SECRET", secret)
	p := start(t, "standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", "",
		"--webhook-url", sink.URL, "--webhook-batch-wait", "10ms")
	m := p.awaitOutput(t, devReadyRE)
	bob := dial(t, "ws://"+m[1]+"/ws?user=bob", client.Options{})
	defer systest.KeepAlive(bob, 300*time.Millisecond)()
	sink.Await(t, "bob", presence.Online)
	if err := bob.SetStatus("invisible"); err != nil {
		t.Fatal(err)
	}
	// The app's backend knows by default.
	sink.Await(t, "bob", presence.Invisible)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, p.stderr)
	}
}
