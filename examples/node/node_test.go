package nodeclient_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/tcpproxy"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// The tests run presence.js with Node.js as a child process against a
// whole greendot system in the test process (embedded NATS, reaper, fanout,
// gateway) with fast timings, and read the JSON lines it prints. Without
// Node.js or the example's packages they fail in CI (CI=true) and are
// skipped elsewhere, with a line that says what to install.

// Timings of the system under test: a heartbeat every 400ms, a connection
// silent for 2s is dead.
const (
	ttl       = 2 * time.Second
	heartbeat = 400 * time.Millisecond
	grace     = time.Second
	// backoffMax caps the script's reconnect delays, so that a restarted
	// gateway is found again quickly.
	backoffBase = 200
	backoffMax  = 1000
	// wait bounds every wait for something the script or a Go client sees;
	// the machine may be loaded.
	wait = 20 * time.Second
)

// nodeBinary returns the node to run presence.js with. When there is none,
// or it is too old, or the example's packages are not installed, it fails
// the test in CI (the environment variable CI is true), where these tests
// are mandatory, and skips it elsewhere.
func nodeBinary(t *testing.T) string {
	t.Helper()
	const install = "install Node.js 18.3 or newer (apt-get install -y nodejs npm) " +
		"and the example's packages (npm ci --prefix examples/node)"
	missing := func(why string) {
		t.Helper()
		tooltest.Missing(t, "no Node.js client tests: "+why+": "+install)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH")
		return ""
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		missing(fmt.Sprintf("%s --version: %v", node, err))
		return ""
	}
	version := strings.TrimSpace(string(out))
	m := regexp.MustCompile(`^v(\d+)\.(\d+)\.`).FindStringSubmatch(version)
	if m == nil {
		missing(fmt.Sprintf("%s --version says %q", node, version))
		return ""
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major < 18 || major == 18 && minor < 3 {
		missing(fmt.Sprintf("%s is Node.js %s", node, version))
		return ""
	}
	if _, err := os.Stat(filepath.Join("node_modules", "ws", "package.json")); err != nil {
		missing("examples/node/node_modules has no ws package")
		return ""
	}
	return node
}

// event is one line presence.js prints; each kind of event uses some of
// the fields.
type event struct {
	Event string `json:"event"`
	// connected, presence, self
	UserID              string `json:"user_id"`
	ConnID              string `json:"conn_id"`
	Status              string `json:"status"`
	HeartbeatIntervalMS int64  `json:"heartbeat_interval_ms"`
	TTLMS               int64  `json:"ttl_ms"`
	Snapshot            bool   `json:"snapshot"`
	Devices             int    `json:"devices"`
	// disconnected
	CloseCode  int    `json:"close_code"`
	HTTPStatus int    `json:"http_status"`
	Reason     string `json:"reason"`
	RetryInMS  int64  `json:"retry_in_ms"`
	Attempt    int    `json:"attempt"`
	// error
	Code    string `json:"code"`
	Message string `json:"message"`

	raw string
	bad error // the line is not an event
}

func (e event) String() string { return e.raw }

// script is a running presence.js. Its output is read as it comes, into
// memory, so that the child never blocks on a full pipe (a blocked write
// would stop its heartbeats too).
type script struct {
	t   *testing.T
	cmd *exec.Cmd

	mu      sync.Mutex
	events  []event
	stderr  bytes.Buffer
	exited  bool
	exitErr error
	changed chan struct{} // closed at every new event and at exit

	next int // the first event no wait has looked at; the test's goroutine only
}

// startScript runs node presence.js args, with extra environment
// variables; it is killed, if still running, when the test ends.
func startScript(t *testing.T, node string, env []string, args ...string) *script {
	t.Helper()
	cmd := exec.Command(node, append([]string{"presence.js"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GREENDOT_TOKEN=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	s := &script{t: t, cmd: cmd, changed: make(chan struct{})}
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.stderr.Write(p)
	})
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			e := event{raw: sc.Text()}
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				e.bad = err
			} else if e.Event == "" {
				e.bad = errors.New(`no "event" field`)
			}
			s.mu.Lock()
			s.events = append(s.events, e)
			s.signalLocked()
			s.mu.Unlock()
		}
		err := cmd.Wait()
		s.mu.Lock()
		s.exited, s.exitErr = true, err
		s.signalLocked()
		s.mu.Unlock()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-done:
		case <-time.After(wait):
			t.Errorf("presence.js (pid %d) not gone %v after it was killed", cmd.Process.Pid, wait)
		}
	})
	return s
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (s *script) signalLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// report describes what the script printed, for a failure message.
func (s *script) report() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	from := max(0, len(s.events)-30)
	fmt.Fprintf(&b, "\nstdout (last %d lines):", len(s.events)-from)
	for _, e := range s.events[from:] {
		b.WriteString("\n  " + e.raw)
	}
	fmt.Fprintf(&b, "\nstderr: %s", strings.TrimSpace(s.stderr.String()))
	if s.exited {
		fmt.Fprintf(&b, "\nexited: %v", s.exitErr)
	}
	return b.String()
}

// await reads the script's events until one matches, and returns it;
// events before it are passed over. It fails the test on a line that is
// not an event, when the script exits first, or after timeout.
func (s *script) await(what string, timeout time.Duration, match func(event) bool) event {
	s.t.Helper()
	var found event
	s.until(what, timeout, func(e event) bool {
		if match(e) {
			found = e
			return true
		}
		return false
	})
	return found
}

// awaitAll reads events until each of matches has matched one, in any
// order.
func (s *script) awaitAll(what string, timeout time.Duration, matches ...func(event) bool) {
	s.t.Helper()
	pending := append([]func(event) bool(nil), matches...)
	s.until(what, timeout, func(e event) bool {
		for i, m := range pending {
			if m(e) {
				pending = append(pending[:i], pending[i+1:]...)
				break
			}
		}
		return len(pending) == 0
	})
}

// until feeds events to take until it returns true.
func (s *script) until(what string, timeout time.Duration, take func(event) bool) {
	s.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		for s.next < len(s.events) {
			e := s.events[s.next]
			s.next++
			if e.bad != nil {
				s.mu.Unlock()
				s.t.Fatalf("waiting for %s: presence.js printed a line that is not an event (%v): %s%s", what, e.bad, e.raw, s.report())
			}
			if take(e) {
				s.mu.Unlock()
				return
			}
		}
		exited, changed := s.exited, s.changed
		s.mu.Unlock()
		if exited {
			s.t.Fatalf("waiting for %s: presence.js exited%s", what, s.report())
		}
		select {
		case <-changed:
		case <-deadline.C:
			s.t.Fatalf("waiting for %s: not seen within %v%s", what, timeout, s.report())
		}
	}
}

// steady reads the script's events for d and fails the test if it
// disconnects, exits or prints a line that is not an event meanwhile.
func (s *script) steady(d time.Duration, what string) {
	s.t.Helper()
	end := time.NewTimer(d)
	defer end.Stop()
	for {
		s.mu.Lock()
		for ; s.next < len(s.events); s.next++ {
			if e := s.events[s.next]; e.bad != nil || e.Event == "disconnected" {
				s.mu.Unlock()
				s.t.Fatalf("%s: presence.js printed %s%s", what, e.raw, s.report())
			}
		}
		exited, changed := s.exited, s.changed
		s.mu.Unlock()
		if exited {
			s.t.Fatalf("%s: presence.js exited%s", what, s.report())
		}
		select {
		case <-changed:
		case <-end.C:
			return
		}
	}
}

// exit waits for the script to end and returns its exit code and stderr.
func (s *script) exit(timeout time.Duration) (int, string) {
	s.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		exited, err, stderr, changed := s.exited, s.exitErr, s.stderr.String(), s.changed
		s.mu.Unlock()
		if exited {
			var ee *exec.ExitError
			switch {
			case err == nil:
				return 0, stderr
			case errors.As(err, &ee) && ee.Exited():
				return ee.ExitCode(), stderr
			default:
				s.t.Fatalf("presence.js ended abnormally: %v%s", err, s.report())
			}
		}
		select {
		case <-changed:
		case <-deadline.C:
			s.t.Fatalf("presence.js still runs %v later%s", timeout, s.report())
		}
	}
}

// signal sends sig to the script.
func (s *script) signal(sig os.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal presence.js: %v", err)
	}
}

func isConnected(e event) bool { return e.Event == "connected" }

// presenceOf matches a presence line of user with status, from a
// subscription snapshot or from a change.
func presenceOf(user string, status presence.Status, snapshot bool) func(event) bool {
	return func(e event) bool {
		return e.Event == "presence" && e.UserID == user && e.Status == string(status) && e.Snapshot == snapshot
	}
}

// checkRetries checks the delays of the reconnect attempts the script
// announced: within the jitter window after a drain (1001), and otherwise
// within the exponential backoff cap of their attempt.
func checkRetries(t *testing.T, events []event) {
	t.Helper()
	for _, e := range events {
		if e.Event != "disconnected" {
			continue
		}
		limit := int64(1000)
		if e.CloseCode != 1001 {
			limit = min(int64(backoffMax), int64(backoffBase)<<min(e.Attempt-1, 30))
		}
		if e.RetryInMS < 0 || e.RetryInMS >= limit || e.Attempt < 0 {
			t.Errorf("retry delay %dms (attempt %d) is outside [0, %dms): %s", e.RetryInMS, e.Attempt, limit, e.raw)
		}
	}
}

// TestNodeClient runs presence.js as alice, watching bob and carol, and
// checks what it prints and what a Go client sees of it: the hello, the
// subscription snapshot, bob's change, alice's chosen status, heartbeats
// that keep her online across several TTLs, and after the gateway is
// stopped and started again on the same address, the reconnect, the
// subscription and status restored, and a new change seen.
func TestNodeClient(t *testing.T) {
	node := nodeBinary(t)
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{ConnTTL: ttl, HeartbeatInterval: heartbeat, OfflineGrace: grace}})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob", "carol")

	bob := sys.Dial(gw, "bob")
	stopBob := systest.KeepAlive(bob, heartbeat)
	if err := bob.Subscribe("b1", "alice"); err != nil {
		t.Fatal(err)
	}
	bobView := systest.NewView(t, bob)
	bobView.Await("alice", presence.Offline)

	s := startScript(t, node, nil, "--url", gw.WS, "--user", "alice", "--device", "cli", "--status", "away",
		"--backoff-base-ms", strconv.Itoa(backoffBase), "--backoff-max-ms", strconv.Itoa(backoffMax), "bob", "carol")

	hello := s.await("connected", wait, isConnected)
	if hello.UserID != "alice" || hello.ConnID == "" || hello.HeartbeatIntervalMS != heartbeat.Milliseconds() || hello.TTLMS != ttl.Milliseconds() {
		t.Errorf("connected: %s, want alice with a connection id, heartbeat_interval_ms %d and ttl_ms %d",
			hello, heartbeat.Milliseconds(), ttl.Milliseconds())
	}
	// The snapshot and the self frames that follow set_status come in
	// either order.
	s.awaitAll("the snapshot (bob online, carol offline) and self away", wait,
		presenceOf("bob", presence.Online, true), presenceOf("carol", presence.Offline, true),
		func(e event) bool { return e.Event == "self" && e.Status == "away" && e.Devices == 1 })
	bobView.Await("alice", presence.Away)

	if err := bob.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	s.await("bob busy", wait, presenceOf("bob", presence.Busy, false))

	// The gateway drops a connection silent for the TTL: alice's stays
	// open across several, and is still hers in the store.
	s.steady(3*ttl+heartbeat, "heartbeats for three TTLs")
	rec, err := sys.StatusOf("alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.Conns[hello.ConnID]; !ok || rec.Status != presence.Away {
		t.Fatalf("alice after three TTLs: status %s, connections %v; want away on %s", rec.Status, rec.Conns, hello.ConnID)
	}
	if p, _ := bobView.Presence("alice"); p.Status != presence.Away {
		t.Errorf("bob sees alice %s after three TTLs, want away", p.Status)
	}

	// Stop the gateway: it closes its sockets with 1001 (draining).
	stopBob()
	sys.StopGateway(gw)
	s.await("disconnected with 1001", wait, func(e event) bool { return e.Event == "disconnected" && e.CloseCode == 1001 })
	// While alice is disconnected, her chosen status is lost from the store (as if
	// it were rebuilt): the gateway's hello will then say online, and only
	// the script restoring its choice makes her away again.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, _, _, err := sys.Store.UpdateStatus(ctx, "alice", func(r *presence.Record) error {
		r.Chosen = ""
		return nil
	}); err != nil {
		t.Fatalf("clear alice's chosen status: %v", err)
	}
	gw2 := sys.StartGatewayAt(gateway.Config{}, gw.Addr)

	again := s.await("connected again", wait, isConnected)
	if again.UserID != "alice" || again.ConnID == hello.ConnID {
		t.Errorf("connected again: %s, want alice on a new connection", again)
	}
	if again.Status != string(presence.Online) {
		t.Fatalf("the gateway's hello after the restart says %s, want online: the test of the restored status would prove nothing", again.Status)
	}
	s.awaitAll("the snapshot again and self away", wait,
		func(e event) bool { return e.Event == "presence" && e.UserID == "bob" && e.Snapshot },
		func(e event) bool { return e.Event == "presence" && e.UserID == "carol" && e.Snapshot },
		func(e event) bool { return e.Event == "self" && e.Status == "away" })

	bob2 := sys.Dial(gw2, "bob")
	defer systest.KeepAlive(bob2, heartbeat)()
	if err := bob2.Subscribe("b2", "alice"); err != nil {
		t.Fatal(err)
	}
	bob2View := systest.NewView(t, bob2)
	bob2View.Await("alice", presence.Away)
	if err := bob2.SetStatus("online"); err != nil {
		t.Fatal(err)
	}
	s.await("bob online after the reconnect", wait, presenceOf("bob", presence.Online, false))

	// SIGTERM: a clean close, exit 0, and alice offline after the grace.
	s.signal(syscall.SIGTERM)
	if code, stderr := s.exit(wait); code != 0 {
		t.Errorf("after SIGTERM: exit code %d, want 0; stderr: %s", code, stderr)
	}
	bob2View.Await("alice", presence.Offline)

	s.mu.Lock()
	events := append([]event(nil), s.events...)
	s.mu.Unlock()
	checkRetries(t, events)
}

// pathProxy is a TCP proxy to a gateway whose connections can die as a
// network path does: passing no more bytes either way, and no close.
type pathProxy struct {
	*tcpproxy.Proxy
	// upgradeOnly makes the links made while it is set die right after the
	// gateway's answer to the upgrade: before its hello.
	upgradeOnly atomic.Bool
}

// startProxy proxies a loopback port to target until the test ends.
func startProxy(t *testing.T, target string) *pathProxy {
	t.Helper()
	p := &pathProxy{}
	p.Proxy = tcpproxy.Start(t, target, func(l *tcpproxy.Link) (_, fromGateway tcpproxy.Filter) {
		if p.upgradeOnly.Load() {
			fromGateway = untilHeadersEnd(l)
		}
		return nil, fromGateway
	})
	return p
}

// untilHeadersEnd passes what the gateway sends on l up to the end of its
// HTTP headers, and makes l die there.
func untilHeadersEnd(l *tcpproxy.Link) tcpproxy.Filter {
	var head []byte // what passed of the headers
	return func(b []byte) []byte {
		head = append(head, b...)
		i := bytes.Index(head, []byte("\r\n\r\n"))
		if i < 0 {
			return b
		}
		l.Hold()
		return b[:len(b)-(len(head)-i-4)]
	}
}

// kill makes every connection the proxy holds now a dead path; later
// ones pass.
func (p *pathProxy) kill() {
	for _, l := range p.Links() {
		l.Hold()
	}
}

// TestNodeClientDeadPath: the network path to the gateway dies without a
// close. The script notices from its unanswered pings (within ttl_ms and
// one heartbeat interval), drops the socket, and connects again.
func TestNodeClientDeadPath(t *testing.T) {
	node := nodeBinary(t)
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{ConnTTL: ttl, HeartbeatInterval: heartbeat, OfflineGrace: grace}})
	p := startProxy(t, sys.Gateway().Addr)
	s := startScript(t, node, nil, "--url", "ws://"+p.Addr()+"/ws", "--user", "frank",
		"--backoff-base-ms", strconv.Itoa(backoffBase), "--backoff-max-ms", strconv.Itoa(backoffMax), "frank")
	first := s.await("connected", wait, isConnected)
	s.await("own snapshot", wait, presenceOf("frank", presence.Online, true))

	p.kill()
	lost := s.await("disconnected", wait, func(e event) bool { return e.Event == "disconnected" })
	if lost.CloseCode != 1006 || !strings.Contains(lost.Reason, "no answer from the gateway") {
		t.Errorf("after the path died: %s, want close code 1006 and no answer from the gateway", lost)
	}
	again := s.await("connected again", wait, isConnected)
	if again.ConnID == first.ConnID {
		t.Errorf("connected again on the same connection %s", again.ConnID)
	}
	s.await("own snapshot again", wait, presenceOf("frank", presence.Online, true))
}

// TestNodeClientNoHello: the network path dies right after the gateway
// accepted the upgrade, before its hello. The script waits for the hello
// no longer than for the handshake (10s), drops the socket, and connects
// again.
func TestNodeClientNoHello(t *testing.T) {
	node := nodeBinary(t)
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{ConnTTL: ttl, HeartbeatInterval: heartbeat, OfflineGrace: grace}})
	p := startProxy(t, sys.Gateway().Addr)
	p.upgradeOnly.Store(true)
	s := startScript(t, node, nil, "--url", "ws://"+p.Addr()+"/ws", "--user", "frank",
		"--backoff-base-ms", strconv.Itoa(backoffBase), "--backoff-max-ms", strconv.Itoa(backoffMax), "frank")
	lost := s.await("disconnected", wait, func(e event) bool {
		if e.Event == "connected" {
			t.Fatalf("connected through a path that passes no hello: %s", e)
		}
		return e.Event == "disconnected"
	})
	if lost.CloseCode != 1006 || !strings.Contains(lost.Reason, "no hello") {
		t.Errorf("after the path died: %s, want close code 1006 and no hello", lost)
	}
	p.upgradeOnly.Store(false)
	s.await("connected", wait, isConnected)
	s.await("own snapshot", wait, presenceOf("frank", presence.Online, true))
}

// TestNodeClientStops checks that presence.js gives up, with a message
// on stderr and its documented exit code, where coming back could only be
// refused again: a bad token or dev auth refused at the handshake (3), a
// close with 1008 when kicked (4), and a bad command line (2). A good
// token, sent in the Authorization header, connects, and a kick with a
// normal close (1000) is followed by a reconnect.
func TestNodeClientStops(t *testing.T) {
	node := nodeBinary(t)
	secret := []byte("a secret of at least thirty-two bytes, for HS256")
	v, err := auth.New(auth.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Tokens: v, ConnTTL: ttl, HeartbeatInterval: heartbeat, OfflineGrace: grace}})
	gw := sys.Gateway()
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Subject:   "dave",
		ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
	}).SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("good token, then kicked with 1000 and 1008", func(t *testing.T) {
		s := startScript(t, node, []string{"GREENDOT_TOKEN=" + token}, "--url", gw.WS)
		if hello := s.await("connected", wait, isConnected); hello.UserID != "dave" {
			t.Fatalf("connected as %q, want dave (the token's sub)", hello.UserID)
		}
		kick := func(code int) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			replies, err := adminclient.Kick(ctx, sys.NC, admin.KickRequest{UserID: "dave", Code: code}, wait)
			if err != nil || len(replies) != 1 || len(replies[0].Closed) != 1 {
				t.Fatalf("kick dave with %d: %+v, %v; want one connection closed", code, replies, err)
			}
		}
		// A normal close (1000) is not a refusal: the script comes back.
		kick(1000)
		s.await("disconnected with 1000", wait, func(e event) bool { return e.Event == "disconnected" && e.CloseCode == 1000 })
		s.await("connected again", wait, isConnected)
		kick(1008)
		code, stderr := s.exit(wait)
		if code != 4 || !strings.Contains(stderr, "closed the connection with 1008") || !strings.Contains(stderr, "not reconnecting") {
			t.Errorf("after a kick: exit code %d, stderr %q; want 4 and the close code", code, stderr)
		}
	})

	refused := []struct {
		name string
		env  []string
		args []string
	}{
		{"bad token", []string{"GREENDOT_TOKEN=not-a-token"}, nil},
		{"dev auth without dev auth", nil, []string{"--user", "dave"}},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			s := startScript(t, node, tc.env, append([]string{"--url", gw.WS, "bob"}, tc.args...)...)
			code, stderr := s.exit(wait)
			if code != 3 || !strings.Contains(stderr, "the gateway refused the connection: HTTP 401") || !strings.Contains(stderr, "not reconnecting") {
				t.Errorf("exit code %d, stderr %q; want 3 and the refusal", code, stderr)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if len(s.events) != 0 {
				t.Errorf("printed %d events before giving up, want none:%s", len(s.events), s.events[0].raw)
			}
		})
	}

	usage := []struct {
		name, want string
		env        []string
		args       []string
	}{
		{"no identity", "give --user (dev auth) or a JWT in GREENDOT_TOKEN", nil, []string{"bob"}},
		{"both identities", "not both", []string{"GREENDOT_TOKEN=" + token}, []string{"--user", "dave"}},
		{"bad user id", `user id "b o b"`, nil, []string{"--user", "dave", "b o b"}},
		{"bad status", `--status "offline"`, nil, []string{"--user", "dave", "--status", "offline"}},
		{"bad url", "the scheme must be", nil, []string{"--user", "dave", "--url", "ftp://example.com/ws"}},
		{"unknown option", "--colour", nil, []string{"--user", "dave", "--colour"}},
	}
	for _, tc := range usage {
		t.Run(tc.name, func(t *testing.T) {
			s := startScript(t, node, tc.env, tc.args...)
			if code, stderr := s.exit(wait); code != 2 || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit code %d, stderr %q; want 2 and %q", code, stderr, tc.want)
			}
		})
	}
}

// userIDs returns n user ids: prefix0, prefix1, ...
func userIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return ids
}

// awaitSnapshots reads the script's events until every one of ids had a
// snapshot, and returns how many errors rate_limited it printed meanwhile.
func (s *script) awaitSnapshots(ids []string) (rateLimited int) {
	s.t.Helper()
	missing := make(map[string]bool, len(ids))
	for _, id := range ids {
		missing[id] = true
	}
	s.until(fmt.Sprintf("the snapshot of %d users", len(ids)), wait, func(e event) bool {
		switch {
		case e.Event == "presence" && e.Snapshot:
			delete(missing, e.UserID)
		case e.Event == "error" && e.Code == "rate_limited":
			rateLimited++
		case e.Event == "error" || e.Event == "denied" || e.Event == "disconnected":
			s.t.Fatalf("waiting for the snapshots: presence.js printed %s%s", e.raw, s.report())
		}
		return len(missing) == 0
	})
	return rateLimited
}

// TestNodeClientRequestWindow: the script watches more users than the
// subscribes the gateway lets wait at once take, and the app, which the
// gateway asks, holds the first subscribe. The script keeps at most 8
// waiting and sends the others as they are answered: the gateway refuses
// none, and every user's snapshot arrives.
func TestNodeClientRequestWindow(t *testing.T) {
	node := nodeBinary(t)
	const subject = "app.authz"
	ids := userIDs("u", 2000) // 20 subscribes
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{
		ConnTTL: ttl, HeartbeatInterval: heartbeat, OfflineGrace: grace,
		Policy: gateway.PolicyApp, AppSubject: subject, AppTimeout: time.Minute, MaxSubscriptions: len(ids),
	}})
	gw := sys.Gateway()
	// The app allows every user asked about, but holds its first answer
	// until hold is closed.
	hold := make(chan struct{})
	var first sync.Once
	var answers sync.WaitGroup
	sub, err := sys.NC.Subscribe(subject, func(m *nats.Msg) {
		var q struct{ Targets []string }
		if err := json.Unmarshal(m.Data, &q); err != nil {
			t.Errorf("question %s: %v", m.Data, err)
			return
		}
		answer, _ := json.Marshal(map[string][]string{"allow": q.Targets})
		held := false
		first.Do(func() { held = true })
		if !held {
			_ = m.Respond(answer)
			return
		}
		answers.Go(func() {
			<-hold
			_ = m.Respond(answer)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sub.Unsubscribe()
		answers.Wait()
	})

	s := startScript(t, node, nil, append([]string{"--url", gw.WS, "--user", "alice"}, ids...)...)
	// With the first subscribe held, the others the script sends wait
	// behind it at the gateway.
	natstest.CheckFor(t, wait, 10*time.Millisecond, func() error {
		if n, _ := metricstest.Value(gw.Registry(), "greendot_gateway_messages_received_total", "type", "subscribe"); n < 8 {
			return fmt.Errorf("the gateway read %v subscribes, want 8 waiting", n)
		}
		return nil
	})
	close(hold)
	if n := s.awaitSnapshots(ids); n > 0 {
		t.Errorf("the gateway refused %d subscribes with rate_limited; want none", n)
	}
}

// TestNodeClientDroppedSubscribesAgain: the gateway's message rate limit
// takes fewer messages at once than the script sends on connecting (its
// status and the subscribes of its watch list); it drops the last with an
// error rate_limited that names no message. The script sends the
// subscribes not yet answered again after a backoff, and every user's
// snapshot arrives.
func TestNodeClientDroppedSubscribesAgain(t *testing.T) {
	node := nodeBinary(t)
	ids := userIDs("u", 600) // 6 subscribes, after set_status
	// Slow heartbeats leave the socket's messages to the script's requests.
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{
		ConnTTL: 30 * time.Second, HeartbeatInterval: 10 * time.Second, OfflineGrace: grace,
		Policy: gateway.PolicyEveryone, MaxSubscriptions: len(ids),
		RateLimit: 2, RateBurst: 6, RateStrikes: 1000,
	}})
	s := startScript(t, node, nil, append([]string{"--url", sys.Gateway().WS, "--user", "alice", "--status", "busy"}, ids...)...)
	if n := s.awaitSnapshots(ids); n == 0 {
		t.Error("the gateway dropped no message: the test proves nothing")
	}
}
