package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// TestProcesses runs a gateway, a reaper and a fanout as separate commands
// against one NATS server, as a deployment does.
func TestProcesses(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	natsURL := srv.ClientURL()
	secret := "the gateway's HMAC secret, 32+ bytes"
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gwAddr, reaperMetrics, fanoutMetrics := freeAddr(t), freeAddr(t), freeAddr(t)

	reaper := start(t, "reaper", "--nats-url", natsURL, "--metrics-listen", reaperMetrics, "--sweep-interval", "1s", "--log-format", "json")
	fanout := start(t, "fanout", "--nats-url", natsURL, "--metrics-listen", fanoutMetrics)
	gw := start(t, append([]string{"gateway", "--nats-url", natsURL, "--listen", gwAddr, "--gateway-id", "gw-test",
		"--dev-auth", "--jwt-secret-file", secretFile, "--jwt-issuer", "https://id.example",
		"--allowed-origins", "https://app.example, https://admin.example"}, fast...)...)

	for m, family := range map[string]string{reaperMetrics: "greendot_reaper_", fanoutMetrics: "greendot_fanout_", gwAddr: "greendot_gateway_"} {
		natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			code, body := getQuiet("http://" + m + "/readyz")
			if code != http.StatusOK {
				return &statusError{code, body}
			}
			return nil
		})
		if code, body := httpGet(t, "http://"+m+"/healthz"); code != http.StatusOK || !strings.Contains(body, `"ok"`) {
			t.Errorf("GET %s/healthz = %d %s", m, code, body)
		}
		if code, body := httpGet(t, "http://"+m+"/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") || !strings.Contains(body, family) {
			t.Errorf("GET %s/metrics = %d, without go_goroutines or %s metrics", m, code, family)
		}
	}

	if code, body := httpGet(t, "http://"+gwAddr+"/greendot.js"); code != http.StatusOK || !strings.Contains(body, "GreenDot") {
		t.Errorf("GET /greendot.js from the gateway = %d", code)
	}
	if code, _ := httpGet(t, "http://"+gwAddr+"/"); code != http.StatusNotFound {
		t.Errorf("GET / from a gateway = %d, want 404: the demo is for standalone mode only", code)
	}

	for _, pair := range [][2]string{{"alice", "bob"}, {"bob", "alice"}} {
		if code, _, stderr := runOnce(t, "graph", "follow", "--nats-url", natsURL, pair[0], pair[1]); code != 0 {
			t.Fatalf("graph follow %v: exit %d: %s", pair, code, stderr)
		}
	}

	// Browsers may connect only from the allowed origins.
	_, err := client.Dial(context.Background(), "ws://"+gwAddr+"/ws?user=alice", client.Options{Header: http.Header{"Origin": {"https://evil.example"}}})
	var he *client.HandshakeError
	if !errors.As(err, &he) || he.Status != http.StatusForbidden {
		t.Errorf("dial from another origin: err = %v, want 403", err)
	}
	alice := dial(t, "ws://"+gwAddr+"/ws?user=alice", client.Options{Header: http.Header{"Origin": {"https://admin.example"}}})
	defer systest.KeepAlive(alice, 300*time.Millisecond)()
	if err := alice.Subscribe("s", "bob"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Offline)

	// Bob proves who he is with a token signed with the secret in the file.
	var token string
	token, err = jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Subject: "bob", Issuer: "https://id.example", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
	}).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	bob := dial(t, "ws://"+gwAddr+"/ws", client.Options{Header: http.Header{"Authorization": {"Bearer " + token}}})
	if bob.Hello.UserID != "bob" {
		t.Fatalf("hello = %+v, want bob", bob.Hello)
	}
	stopBob := systest.KeepAlive(bob, 300*time.Millisecond)
	systest.AwaitStatus(t, alice, "bob", presence.Online)
	if err := bob.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Away)

	// Bob dies silently: the reaper process turns him offline after the TTL.
	stopBob()
	if err := bob.Abort(); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	systest.AwaitStatus(t, alice, "bob", presence.Offline)
	if d := time.Since(died); d > 1*time.Second+2*time.Second+time.Second {
		t.Errorf("bob seen offline %v after dying, want within TTL + 2s (and scheduling slack)", d)
	}

	for _, p := range []*proc{gw, fanout, reaper} {
		if code := p.stop(t); code != 0 {
			t.Errorf("greendot %s: exit code %d, want 0; stderr:\n%s", p.args[0], code, p.stderr)
		}
	}
	if !strings.Contains(reaper.stderr.String(), `"level":"INFO"`) {
		t.Errorf("--log-format json gave no JSON log lines:\n%s", reaper.stderr)
	}
}

type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string { return http.StatusText(e.code) + ": " + e.body }

// getQuiet is httpGet for polling: it reports a failed request as status 0.
func getQuiet(url string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	buf := make([]byte, 512)
	n, _ := resp.Body.Read(buf)
	return resp.StatusCode, string(buf[:n])
}

// TestStoppedWhileStarting stops each process kind while it waits for
// JetStream to answer at start, as SIGINT does: that is a clean shutdown,
// with exit code 0, not a failure.
func TestStoppedWhileStarting(t *testing.T) {
	t.Parallel()
	// A NATS server without JetStream, where a client that never answers
	// takes JetStream's requests: a start waits on them.
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server did not start")
	}
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}()
	nc := natstest.Connect(t, srv)

	for _, args := range [][]string{
		{"gateway", "--dev-auth", "--listen", freeAddr(t)},
		// The health server's log line is the first output, which start
		// waits for.
		{"reaper", "--metrics-listen", freeAddr(t)},
		{"fanout", "--metrics-listen", freeAddr(t)},
		{"webhooks", "--url", "http://127.0.0.1:1/hooks", "--secret", strings.Repeat("s", 16), "--metrics-listen", freeAddr(t)},
	} {
		t.Run(args[0], func(t *testing.T) {
			asked := make(chan struct{}, 1)
			sub, err := nc.Subscribe("$JS.API.>", func(*nats.Msg) {
				select {
				case asked <- struct{}{}:
				default:
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			p := start(t, append(args, "--nats-url", srv.ClientURL())...)
			select {
			case <-asked:
			case <-time.After(20 * time.Second):
				t.Fatalf("no JetStream request within 20s; stderr:\n%s", p.stderr)
			}
			if code := p.stop(t); code != 0 {
				t.Errorf("exit code %d after a stop while starting, want 0; stderr:\n%s", code, p.stderr)
			}
		})
	}
}
