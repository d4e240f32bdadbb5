package main

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/syncbuf"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system"
	"github.com/greendot/greendot/system/systest"
)

// devReadyRE matches the line standalone mode prints when it serves with
// dev auth; the submatches are the gateway's host:port and the NATS URL.
var devReadyRE = regexp.MustCompile(`greendot standalone: open http://\S+/ for the demo, or connect to ws://([^/\s]+)/ws\?user=alice \(dev auth is on[^)]*\); NATS ([^;]+); data `)

// jwtReadyRE matches the line standalone mode prints without dev auth.
var jwtReadyRE = regexp.MustCompile(`greendot standalone: connect to ws://([^/\s]+)/ws with a JWT .*; dev auth is off;`)

// fast are timing flags that let a test see expiry and grace quickly.
var fast = []string{"--conn-ttl", "1s", "--heartbeat-interval", "300ms", "--offline-grace", "1s", "--batch-interval", "10ms"}

func dial(t *testing.T, url string, o client.Options) *client.Conn {
	t.Helper()
	c, err := client.Dial(context.Background(), url, o)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { _ = c.Abort() })
	return c
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for sb.Len() < 1<<20 {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, sb.String()
}

// TestStandalone runs the standalone command as main does, uses it as a
// client and an operator would, and stops it as Ctrl-C does.
func TestStandalone(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	p := start(t, append([]string{"standalone", "--data", data, "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--sweep-interval", "1s"}, fast...)...)
	m := p.awaitOutput(t, devReadyRE)
	addr, natsURL := m[1], m[2]
	if !strings.HasPrefix(natsURL, "nats://127.0.0.1:") || strings.HasSuffix(natsURL, ":0") {
		t.Fatalf("NATS URL %q: want the embedded server's real loopback address", natsURL)
	}
	if !strings.Contains(p.stderr.String(), "DEV AUTH IS ON") {
		t.Errorf("no loud dev auth warning in the log:\n%s", p.stderr)
	}

	// The graph commands reach the embedded server like the nats CLI would.
	for _, pair := range [][2]string{{"alice", "bob"}, {"bob", "alice"}} {
		if code, _, stderr := runOnce(t, "graph", "follow", "--nats-url", natsURL, pair[0], pair[1]); code != 0 {
			t.Fatalf("graph follow %v: exit %d: %s", pair, code, stderr)
		}
	}

	alice := dial(t, "ws://"+addr+"/ws?user=alice", client.Options{})
	if alice.Hello.UserID != "alice" || alice.Hello.TTLMS != 1000 {
		t.Fatalf("hello = %+v, want alice with a 1s TTL", alice.Hello)
	}
	defer systest.KeepAlive(alice, 300*time.Millisecond)()
	if err := alice.Subscribe("s1", "bob"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Offline)

	bob := dial(t, "ws://"+addr+"/ws?user=bob", client.Options{})
	stopBob := systest.KeepAlive(bob, 300*time.Millisecond)
	systest.AwaitStatus(t, alice, "bob", presence.Online)
	if err := bob.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Busy)
	stopBob()
	if err := bob.Close(); err != nil {
		t.Fatal(err)
	}
	systest.AwaitStatus(t, alice, "bob", presence.Offline)

	// The state is in the embedded server, under the documented names.
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	lister := js.KeyValueStoreNames(context.Background())
	for n := range lister.Name() {
		names = append(names, n)
	}
	for _, want := range []string{presence.ConnsBucket, presence.StatusBucket, presence.GraphBucket} {
		if !slices.Contains(names, want) {
			t.Errorf("buckets %v lack %s", names, want)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "jetstream")); err != nil {
		t.Errorf("no JetStream store under --data: %v", err)
	}
	if code, body := httpGet(t, "http://"+addr+"/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz = %d %s", code, body)
	}
	// /metrics serves the metrics of every process standalone runs, with
	// the Go runtime's, which they share, once.
	code, metrics := httpGet(t, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d %s", code, metrics)
	}
	for _, want := range []string{"\ngreendot_gateway_connections ", "\ngreendot_reaper_queued_tasks ", "\ngreendot_fanout_revisions_total "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("GET /metrics has no %s", strings.TrimSpace(want))
		}
	}
	if n := strings.Count(metrics, "\ngo_goroutines "); n != 1 {
		t.Errorf("GET /metrics has go_goroutines %d times, want once", n)
	}
	if code, body := httpGet(t, "http://"+addr+"/"); code != http.StatusOK || !strings.Contains(body, "<html") {
		t.Errorf("GET / (the demo) = %d %.200s", code, body)
	}
	if code, body := httpGet(t, "http://"+addr+"/demo/api/graph?user=alice"); code != http.StatusOK || !strings.Contains(body, "bob") {
		t.Errorf("GET /demo/api/graph?user=alice = %d %s, want alice's graph with bob", code, body)
	}

	startStop := time.Now()
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d after cancel, want 0; stderr:\n%s", code, p.stderr)
	}
	if d := time.Since(startStop); d > 10*time.Second {
		t.Errorf("shutdown took %v", d)
	}
	// Alice's socket was closed by the draining gateway.
	_ = alice.SetReadDeadline(time.Now().Add(5 * time.Second))
	for range 100 {
		if _, _, err := alice.Read(); err != nil {
			var ce *client.CloseError
			if errors.As(err, &ce) && ce.Code != 1001 {
				t.Errorf("alice closed with %d, want 1001", ce.Code)
			}
			break
		}
	}
}

// TestStandaloneInProcessNATS runs standalone with no NATS listener, twice
// in a row on the same data directory, and refuses a second one beside it.
func TestStandaloneInProcessNATS(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	for i := range 2 {
		p := start(t, "standalone", "--data", data, "--listen", "127.0.0.1:0", "--nats-listen", "")
		m := p.awaitOutput(t, devReadyRE)
		if m[2] != "in-process only" {
			t.Errorf("NATS %q, want in-process only", m[2])
		}
		c := dial(t, "ws://"+m[1]+"/ws?user=alice", client.Options{})
		if c.Hello.UserID != "alice" {
			t.Errorf("run %d: hello = %+v", i, c.Hello)
		}
		// A second process on the same store is refused.
		code, _, stderr := runOnce(t, "standalone", "--data", data, "--listen", "127.0.0.1:0", "--nats-listen", "")
		if code != 1 || !strings.Contains(stderr, "is in use by another greendot standalone process") {
			t.Errorf("second standalone on %s: exit %d, stderr %q; want 1 and the lock named", data, code, stderr)
		}
		if code := p.stop(t); code != 0 {
			t.Fatalf("run %d: exit code %d, want 0; stderr:\n%s", i, code, p.stderr)
		}
	}
}

// TestStandaloneFromEnvironment configures standalone mode with
// environment variables only.
func TestStandaloneFromEnvironment(t *testing.T) {
	t.Setenv("GREENDOT_DATA", t.TempDir())
	t.Setenv("GREENDOT_LISTEN", "127.0.0.1:0")
	t.Setenv("GREENDOT_NATS_LISTEN", "")

	t.Run("policy", func(t *testing.T) {
		t.Setenv("GREENDOT_POLICY", "everyone")
		p := start(t, "standalone")
		m := p.awaitOutput(t, devReadyRE)
		code, body := httpGet(t, "http://"+m[1]+"/api/presence/online?user=alice")
		if code != http.StatusOK || !strings.Contains(body, `"count"`) {
			t.Errorf("GET /api/presence/online under GREENDOT_POLICY=everyone = %d %s, want 200 with a count", code, body)
		}
		c := dial(t, "ws://"+m[1]+"/ws?user=alice", client.Options{})
		if err := c.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: "all", All: true}); err != nil {
			t.Fatal(err)
		}
		init := systest.Await(t, c, 5*time.Second, "presence_init", func(m protocol.ServerMessage) bool {
			return m.Type == protocol.TypePresenceInit || m.Type == protocol.TypeDenied
		})
		if init.Type != protocol.TypePresenceInit {
			t.Errorf("subscribe all under everyone = %+v", init)
		}
		if code := p.stop(t); code != 0 {
			t.Errorf("exit code %d", code)
		}
	})

	t.Run("default policy", func(t *testing.T) {
		p := start(t, "standalone")
		m := p.awaitOutput(t, devReadyRE)
		if code, body := httpGet(t, "http://"+m[1]+"/api/presence/online?user=alice"); code != http.StatusForbidden {
			t.Errorf("GET /api/presence/online under the mutual policy = %d %s, want 403", code, body)
		}
		if code := p.stop(t); code != 0 {
			t.Errorf("exit code %d", code)
		}
	})

	// An empty variable leaves its flag as it is by default, empty: it is
	// not taken for a value given where it does not belong.
	t.Run("empty variables", func(t *testing.T) {
		for _, name := range []string{"GREENDOT_JWT_ISSUER", "GREENDOT_JWT_AUDIENCE", "GREENDOT_AUTHZ_APP_URL",
			"GREENDOT_AUTHZ_APP_SUBJECT", "GREENDOT_AUTHZ_APP_SECRET", "GREENDOT_WEBHOOK_SECRET", "GREENDOT_WEBHOOK_CONSUMER"} {
			t.Setenv(name, "")
		}
		p := start(t, "standalone")
		p.awaitOutput(t, devReadyRE)
		if code := p.stop(t); code != 0 {
			t.Errorf("exit code %d", code)
		}
	})

	t.Run("jwt instead of dev auth", func(t *testing.T) {
		secret := "a secret of thirty-two bytes or more"
		t.Setenv("GREENDOT_DEV_AUTH", "false")
		t.Setenv("GREENDOT_JWT_SECRET", secret)
		t.Setenv("GREENDOT_JWT_AUDIENCE", "greendot")
		p := start(t, "standalone")
		m := p.awaitOutput(t, jwtReadyRE)
		if strings.Contains(p.stderr.String(), "DEV AUTH IS ON") {
			t.Errorf("dev auth warning with GREENDOT_DEV_AUTH=false:\n%s", p.stderr)
		}
		// No demo without dev auth: its endpoints take ?user= on trust.
		if code, _ := httpGet(t, "http://"+m[1]+"/"); code != http.StatusNotFound {
			t.Errorf("GET / without dev auth = %d, want 404", code)
		}
		if code, body := httpGet(t, "http://"+m[1]+"/greendot.js"); code != http.StatusOK || !strings.Contains(body, "GreenDot") {
			t.Errorf("GET /greendot.js = %d", code)
		}
		_, err := client.Dial(context.Background(), "ws://"+m[1]+"/ws?user=alice", client.Options{})
		var he *client.HandshakeError
		if !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
			t.Errorf("dev auth dial: err = %v, want 401", err)
		}
		token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
			Subject: "dave", Audience: jwt.ClaimStrings{"greendot"}, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
		}).SignedString([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, "ws://"+m[1]+"/ws?token="+token, client.Options{})
		if c.Hello.UserID != "dave" {
			t.Errorf("hello = %+v, want dave", c.Hello)
		}
		if code := p.stop(t); code != 0 {
			t.Errorf("exit code %d", code)
		}
	})
}

// buildBinary builds the greendot binary into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "greendot")
	if err := system.Build(ctx, bin, system.Greendot); err != nil {
		t.Fatal(err)
	}
	return bin
}

// binary is a greendot binary running standalone mode.
type binary struct {
	cmd    *exec.Cmd
	addr   string // the gateway's host:port
	stderr *syncbuf.Buffer
	exited chan error // cmd.Wait's error, once it exited
}

// startBinary runs bin in standalone mode with dev auth, on free ports,
// with extra flags, and waits for the line saying it serves.
func startBinary(t *testing.T, bin string, extra ...string) *binary {
	t.Helper()
	args := append([]string{"standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"}, extra...)
	b := &binary{cmd: exec.Command(bin, args...), stderr: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	stdout, err := b.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	b.cmd.Stderr = b.stderr
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
	})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var m []string
	timeout := time.After(30 * time.Second)
	for m == nil {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("stdout closed before the ready line; stderr:\n%s", b.stderr.String())
			}
			m = devReadyRE.FindStringSubmatch(l)
		case <-timeout:
			t.Fatalf("no ready line within 30s; stderr:\n%s", b.stderr.String())
		}
	}
	b.addr = m[1]
	go func() {
		for range lines {
		}
		b.exited <- b.cmd.Wait()
	}()
	return b
}

// signal sends sig to the process.
func (b *binary) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := b.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// TestBinarySignals builds the greendot binary and stops it with SIGINT
// and SIGTERM, as a terminal and a process manager do.
func TestBinarySignals(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			b := startBinary(t, bin)
			c := dial(t, "ws://"+b.addr+"/ws?user=alice", client.Options{})
			if c.Hello.UserID != "alice" {
				t.Errorf("hello = %+v", c.Hello)
			}
			b.signal(t, sig)
			select {
			case err := <-b.exited:
				if err != nil {
					t.Errorf("after %v: %v; stderr:\n%s", sig, err, b.stderr.String())
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("still running 20s after %v; stderr:\n%s", sig, b.stderr.String())
			}
			if code := b.cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("exit code %d after %v, want 0", code, sig)
			}
		})
	}
}

// TestBinarySecondSignal stops the greendot binary with a second signal
// while its gateway drains after the first: it ends at once, with 128 and
// the signal's number as its exit code, as a shell says of a process a
// signal ended. That holds for a SIGINT the process started with ignored,
// as a shell script starts a background job (greendot standalone &).
func TestBinarySecondSignal(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	for _, tt := range []struct {
		name    string
		sig     syscall.Signal
		ignored bool // the process starts with sig ignored
	}{
		{"SIGINT", syscall.SIGINT, false},
		{"SIGTERM", syscall.SIGTERM, false},
		{"SIGINT ignored at start", syscall.SIGINT, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.ignored {
				// The child inherits the ignored signal, as from a shell.
				signal.Ignore(tt.sig)
			}
			// Two sockets drained over 2 minutes: the second is closed a
			// minute after the first.
			b := startBinary(t, bin, "--drain-period", "2m")
			if tt.ignored {
				signal.Reset(tt.sig)
			}
			closed := make(chan error, 2)
			for _, user := range []string{"alice", "bob"} {
				c := dial(t, "ws://"+b.addr+"/ws?user="+user, client.Options{})
				defer systest.KeepAlive(c, time.Second)()
				go func() {
					for {
						if _, _, err := c.Read(); err != nil {
							closed <- err
							return
						}
					}
				}()
			}
			b.signal(t, tt.sig)
			// The drain has begun once one socket is closed with 1001.
			select {
			case err := <-closed:
				if ce := (*client.CloseError)(nil); !errors.As(err, &ce) || ce.Code != 1001 {
					t.Fatalf("a socket ended with %v, want a close with 1001", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("no socket closed within 20s of %v; stderr:\n%s", tt.sig, b.stderr.String())
			}
			b.signal(t, tt.sig)
			select {
			case <-b.exited:
			case <-time.After(20 * time.Second):
				t.Fatalf("still running 20s after a second %v; stderr:\n%s", tt.sig, b.stderr.String())
			}
			if code, want := b.cmd.ProcessState.ExitCode(), 128+int(tt.sig); code != want {
				t.Errorf("exit code %d after a second %v (%v), want %d", code, tt.sig, b.cmd.ProcessState, want)
			}
		})
	}
}

// TestStandaloneDrainOutlastsStopTimeout stops standalone mode while its
// gateway drains for longer than a part may take to stop: the drain is
// waited for, and the command exits 0.
func TestStandaloneDrainOutlastsStopTimeout(t *testing.T) {
	defer func(d time.Duration) { stopTimeout = d }(stopTimeout)
	stopTimeout = 2 * time.Second
	p := start(t, "standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", "", "--drain-period", "6s")
	addr := p.awaitOutput(t, devReadyRE)[1]
	// Three sockets are closed 2s apart: the drain takes 4s.
	var conns []*client.Conn
	for _, user := range []string{"alice", "bob", "carol"} {
		c := dial(t, "ws://"+addr+"/ws?user="+user, client.Options{})
		defer systest.KeepAlive(c, 300*time.Millisecond)()
		conns = append(conns, c)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, p.stderr)
	}
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			_, _, err := c.Read()
			if err == nil {
				continue
			}
			if ce := (*client.CloseError)(nil); !errors.As(err, &ce) || ce.Code != 1001 {
				t.Errorf("%s: socket ended with %v, want a close with 1001", c.Hello.UserID, err)
			}
			break
		}
	}
}

// TestStandaloneStoppedWhileStarting stops standalone mode before it
// serves, as a SIGINT while its NATS server starts does: a clean shutdown,
// with exit code 0.
func TestStandaloneStoppedWhileStarting(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr syncbuf.Buffer
	if code := run(ctx, []string{"greendot", "standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", ""}, &stdout, &stderr); code != 0 {
		t.Errorf("exit code %d after a stop while starting, want 0; stderr:\n%s", code, stderr.String())
	}
}

// readyNATSRE matches the NATS part of the ready line: the URL of the
// embedded server, and the NKey it takes, if it takes only one.
var readyNATSRE = regexp.MustCompile(`; NATS (nats://[^\s;]+)(?: with the NKey in ([^;]+))?; data `)

// TestStandaloneProtectsNATS: out of dev mode, the standalone's NATS
// server takes only the NKey the standalone keeps in its data directory:
// its own processes use it, so do the graph commands given it with
// --nats-nkey and the nats CLI with --nkey; without it, no process of the
// machine can rewrite who may watch whom. The ready line and the log say
// so, and the key is the same after a restart. In dev mode the server
// takes anyone, and the log says that too.
func TestStandaloneProtectsNATS(t *testing.T) {
	data := t.TempDir()
	t.Setenv("GREENDOT_JWT_SECRET", "a secret of thirty-two bytes or more")
	args := []string{"standalone", "--data", data, "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--dev-auth=false"}
	p := start(t, args...)
	p.awaitOutput(t, jwtReadyRE)
	line := strings.TrimSpace(p.stdout.String())
	m := readyNATSRE.FindStringSubmatch(p.stdout.String())
	if m == nil {
		t.Fatalf("ready line %q names no NATS URL", line)
	}
	natsURL, key := m[1], m[2]

	// Without the key, nothing.
	if nc, err := nats.Connect(natsURL); err == nil {
		nc.Close()
		t.Errorf("connected to %s without the key", natsURL)
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("connect without the key: %v, want an authorization violation", err)
	}
	if code, _, _ := runOnce(t, "graph", "follow", "--nats-url", natsURL, "mallory", "victim"); code == 0 {
		t.Errorf("graph follow without the key succeeded")
	}

	if want := filepath.Join(data, "nats.nk"); key != want {
		t.Fatalf("ready line %q: NKey in %q, want %q", line, key, want)
	}
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v; want one only its owner reads", fi, err)
	}
	if !strings.Contains(p.stderr.String(), key) {
		t.Errorf("the log does not name the key:\n%s", p.stderr)
	}
	// With it, the graph commands and the nats CLI's way in.
	if code, _, stderr := runOnce(t, "graph", "follow", "--nats-url", natsURL, "--nats-nkey", key, "alice", "bob"); code != 0 {
		t.Errorf("graph follow with the key: exit %d: %s", code, stderr)
	}
	graph := func() map[string]bool {
		opt, err := nats.NkeyOptionFromSeed(key)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(natsURL, opt)
		if err != nil {
			t.Fatalf("connect with the key: %v", err)
		}
		defer nc.Close()
		store, err := presence.Bind(context.Background(), nc, presence.BucketOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, e := range [][2]string{{"alice", "bob"}, {"mallory", "victim"}} {
			if got[e[0]+">"+e[1]], err = store.Follows(context.Background(), e[0], e[1]); err != nil {
				t.Fatal(err)
			}
		}
		return got
	}
	if got := graph(); !got["alice>bob"] || got["mallory>victim"] {
		t.Errorf("follows %v, want alice>bob only", got)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr)
	}

	// Started again on its data, it takes the same key.
	p = start(t, args...)
	p.awaitOutput(t, jwtReadyRE)
	if m := readyNATSRE.FindStringSubmatch(p.stdout.String()); m == nil || m[2] != key {
		t.Errorf("after a restart, NATS %v, want the NKey in %s", m, key)
	} else if natsURL = m[1]; !graph()["alice>bob"] {
		t.Errorf("after a restart, the graph lost alice>bob")
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}

	// In dev mode, anyone: as the log says.
	dev := start(t, "standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0")
	dev.awaitOutput(t, devReadyRE)
	if m := readyNATSRE.FindStringSubmatch(dev.stdout.String()); m == nil || m[2] != "" {
		t.Errorf("dev mode: NATS %v, want no key", m)
	}
	if !strings.Contains(dev.stderr.String(), "takes any client") {
		t.Errorf("dev mode: the log does not say NATS takes any client:\n%s", dev.stderr)
	}
}
