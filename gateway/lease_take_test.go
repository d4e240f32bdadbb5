package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/syncbuf"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
)

// takeWarning is the line a failed attempt to take the lease may log.
const takeWarning = `level=WARN msg="take the gateway's lease: failed; trying again"`

// attemptsRE finds in a readiness error how many attempts to take the
// lease failed.
var attemptsRE = regexp.MustCompile(`\((\d+) attempts? failed\)`)

// TestLeaseTakeFailures starts a gateway while the leases' stream is full
// (it takes no new message: its limit of messages is reached, and it
// discards new ones), so that it cannot take its lease: it logs why, the
// first failed attempt at once and no line per attempt after it, and its
// Ready names the lease and the error, until the stream takes messages
// again; then it serves. Once it serves, the stream fills up again and an
// operator deletes its lease: the gateway finds it lost and cannot take a
// new one, which its Ready says beside the loss, until the stream takes
// messages again.
func TestLeaseTakeFailures(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	ctx := context.Background()
	operator, err := presence.Open(ctx, natstest.Connect(t, srv), presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fill := func() (lift func()) { return fillLeases(t, operator) }
	lift := fill()

	var logs syncbuf.Buffer
	gw, _ := serveGateway(t, srv, gateway.Config{
		DevAuth: true,
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
	})

	// Ready says why, until several attempts have failed.
	start := time.Now()
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		err := gw.Ready(ctx)
		m := attemptsRE.FindStringSubmatch(fmt.Sprint(err))
		if !errors.Is(err, gateway.ErrUnavailable) || !strings.Contains(err.Error(), "starting: taking its lease") ||
			!strings.Contains(err.Error(), "maximum messages exceeded") || m == nil {
			return fmt.Errorf("Ready = %v; want unavailable, taking its lease, with the error and the attempts", err)
		}
		if n, _ := strconv.Atoi(m[1]); n < 4 {
			return fmt.Errorf("Ready = %v; want 4 attempts failed or more", err)
		}
		t.Logf("Ready while starting: %v", err)
		return nil
	})
	// The first failure is logged with its error; the others only every
	// 10 s, with the number of attempts.
	lines := strings.Count(logs.String(), takeWarning)
	if most := 1 + int(time.Since(start)/(10*time.Second)); lines < 1 || lines > most {
		t.Errorf("%d lines log failed attempts to take the lease, want 1 to %d:\n%s", lines, most, logs.String())
	}
	if !strings.Contains(logs.String(), takeWarning+` svc=gateway lease=`) || !regexp.MustCompile(`attempts=1 err=".*maximum messages exceeded`).MatchString(logs.String()) {
		t.Errorf("the first failure's line lacks the lease or the error:\n%s", logs.String())
	}

	lift()
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error { return gw.Ready(ctx) })
	if !strings.Contains(logs.String(), `msg="took the gateway's lease after failed attempts"`) {
		t.Errorf("the lease taken at last is not logged:\n%s", logs.String())
	}

	// The lease is lost while the stream is full again: the refreshes of
	// the lease go on (they replace its message), the take of a new one
	// cannot.
	lift = fill()
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		for _, l := range mustLeases(t, operator) {
			if l.Gateway == gw.ID() {
				return operator.DeleteLease(ctx, l.Gateway, l.Epoch, 0)
			}
		}
		return errors.New("no lease of the gateway's listed")
	})
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		err := gw.Ready(ctx)
		if !errors.Is(err, gateway.ErrUnavailable) || !strings.Contains(err.Error(), "lease was lost") ||
			!strings.Contains(err.Error(), "taking its lease") || !strings.Contains(err.Error(), "maximum messages exceeded") {
			return fmt.Errorf("Ready = %v; want unavailable, its lease lost, and why it cannot take a new one", err)
		}
		t.Logf("Ready with its lease lost: %v", err)
		return nil
	})
	lift()
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error { return gw.Ready(ctx) })
}

// serveGateway runs a gateway with cfg on srv, on a loopback listener,
// until the test ends, without waiting for it to be ready.
func serveGateway(t *testing.T, srv *server.Server, cfg gateway.Config) (*gateway.Service, net.Listener) {
	t.Helper()
	gw, err := gateway.New(natstest.Connect(t, srv), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("the gateway did not stop within 30s")
		}
	})
	return gw, ln
}

// fillLeases limits the leases' stream to the messages it holds (another
// gateway's lease, made if there is none), so that it refuses new ones:
// no gateway can take a lease. It returns a function that lifts the
// limit.
func fillLeases(t *testing.T, operator *presence.Store) (lift func()) {
	t.Helper()
	ctx := context.Background()
	js := operator.JetStream()
	st, err := js.Stream(ctx, presence.StreamName(presence.LeasesBucket))
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().State.Msgs == 0 {
		if _, err := operator.CreateLease(ctx, presence.LeaseRecord{Gateway: "other", Epoch: "e1"}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
	info := st.CachedInfo()
	if info.Config.Discard != jetstream.DiscardNew || info.State.Msgs == 0 {
		t.Fatalf("leases' stream discards %v and holds %d messages; want it to refuse new ones once full, holding some", info.Config.Discard, info.State.Msgs)
	}
	cfg := info.Config
	full := cfg
	full.MaxMsgs = int64(info.State.Msgs)
	if _, err := js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
}

// TestProbesAnsweredWhileStarting starts a gateway that cannot take its
// lease: while it waits, GET /healthz answers 200, GET /readyz 503 with
// what it waits for, GET /metrics its metrics, and a WebSocket upgrade
// 503; once it has its lease, /readyz answers 200 and clients connect.
func TestProbesAnsweredWhileStarting(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	ctx := context.Background()
	operator, err := presence.Open(ctx, natstest.Connect(t, srv), presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lift := fillLeases(t, operator)
	_, ln := serveGateway(t, srv, gateway.Config{DevAuth: true})
	base := "http://" + ln.Addr().String()
	hc := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, string, error) {
		resp, err := hc.Get(base + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}

	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		code, body, err := get("/readyz")
		if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "taking its lease") || !strings.Contains(body, "maximum messages exceeded") {
			return fmt.Errorf("GET /readyz = %d %q, %v; want 503 saying it waits for its lease, and why", code, body, err)
		}
		return nil
	})
	if code, body, err := get("/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("GET /healthz = %d %q, %v; want 200", code, body, err)
	}
	if code, body, err := get("/metrics"); err != nil || code != http.StatusOK || !strings.Contains(body, "greendot_gateway_") {
		t.Errorf("GET /metrics = %d, %v; want 200 and the gateway's metrics:\n%.300s", code, err, body)
	}
	if code, body, err := get("/api/presence/users/alice?user=bob"); err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Errorf("GET /api/presence/users/alice = %d %q, %v; want 503, starting", code, body, err)
	}
	if c, err := client.Dial(ctx, "ws://"+ln.Addr().String()+gateway.WebSocketPath+"?user=alice", client.Options{Timeout: 5 * time.Second}); err == nil || !strings.Contains(err.Error(), "503") {
		if c != nil {
			c.Abort()
		}
		t.Errorf("a WebSocket dial while starting: %v; want refused with 503", err)
	}

	lift()
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		code, body, err := get("/readyz")
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("GET /readyz = %d %q, %v; want 200", code, body, err)
		}
		return nil
	})
	c, err := client.Dial(ctx, "ws://"+ln.Addr().String()+gateway.WebSocketPath+"?user=alice", client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("dial once started: %v", err)
	}
	c.Abort()
}

// mustLeases returns the live leases.
func mustLeases(t *testing.T, store *presence.Store) map[string]presence.LeaseRecord {
	t.Helper()
	leases, err := store.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return leases
}
