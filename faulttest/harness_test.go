package faulttest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/testlog"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/system"
)

// testLogger returns the logger of the in-process service name: its lines
// are shown with a test that fails (see package testlog).
func testLogger(tb testing.TB, name string) *slog.Logger {
	return testlog.New(tb, "proc", name)
}

// tick calls fn every period until stop is closed or fn reports false.
func tick(stop <-chan struct{}, period time.Duration, fn func() bool) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !fn() {
			return
		}
	}
}

// waitFor calls f until it returns nil, or fails the test with f's last
// error after total. Every wait of this package is bounded by it.
func waitFor(tb testing.TB, total time.Duration, what string, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not after %v: %v", what, total, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// --- The greendot binary ---------------------------------------------------

var binary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// TestMain removes the built binary once every test has run.
func TestMain(m *testing.M) {
	code := m.Run()
	if binary.dir != "" {
		_ = os.RemoveAll(binary.dir)
	}
	os.Exit(code)
}

// greendotBinary builds cmd/greendot once per test run, as the Dockerfile
// does, and returns its path.
func greendotBinary(tb testing.TB) string {
	tb.Helper()
	binary.once.Do(func() {
		dir, err := os.MkdirTemp("", "greendot-faulttest-")
		if err != nil {
			binary.err = err
			return
		}
		binary.dir = dir
		path := filepath.Join(dir, "greendot")
		// Built as the Dockerfile builds it, so that the processes under
		// test are the image's.
		df, err := os.ReadFile(repoFile("Dockerfile"))
		if err != nil {
			binary.err = err
			return
		}
		args, err := dockerBuildArgs(string(df))
		if err != nil {
			binary.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if binary.err = system.Build(ctx, path, system.Greendot, args...); binary.err == nil {
			binary.path = path
		}
	})
	if binary.err != nil {
		tb.Fatal(binary.err)
	}
	return binary.path
}

// repoFile returns the path of a file of the repository, from this
// package's directory.
func repoFile(name string) string { return filepath.Join("..", filepath.FromSlash(name)) }

// --- NATS servers loaded from the repository's configuration -------------

// unnamedWatcher matches the one permission violation the processes may
// cause: a KV watcher whose consumer is created while its connection is
// down asks with the unnamed form of the create request (nats.go cannot
// tell the server's version then), which accounts.conf refuses on the
// buckets with durable consumers, since its body may name any consumer. The
// watcher tries again once connected.
var unnamedWatcher = regexp.MustCompile(`"GREENDOT/user:(gateway|reaper)" - Publish Violation - Subject "\$JS\.API\.CONSUMER\.CREATE\.KV_presence_(conns|status|leases)"$`)

// natsNode is one NATS server of a test. It can be shut down and started
// again on the same ports with the same storage.
type natsNode struct {
	name              string
	storeDir          string
	port, clusterPort int
	srv               *server.Server
}

// natsCluster is a set of NATS servers started from the repository's own
// configuration: three nodes from nats.conf, routed into one cluster, or a
// single server from deploy/nats/single.conf. Greendot's processes connect
// with the users and permissions of deploy/nats/accounts.conf, and every
// permission violation the servers log is kept: a test that sees one
// fails.
type natsCluster struct {
	tb    testing.TB
	nodes []*natsNode
	viol  *violations
}

// startCluster starts n JetStream servers on loopback (n is 1 or 3) and
// waits until JetStream has a meta leader and every node is current. They
// are shut down when the test ends; a permission violation logged by any
// of them fails the test.
func startCluster(tb testing.TB, n int) *natsCluster {
	tb.Helper()
	c := &natsCluster{tb: tb, viol: &violations{}}
	// The nodes' storage is made under storage, whose removal is
	// registered before the shutdown, so that the servers are down before
	// it goes: cleanups run last in, first out.
	storage := tb.TempDir()
	tb.Cleanup(func() {
		c.shutdown()
		var refused []string
		for _, v := range c.viol.take() {
			if unnamedWatcher.MatchString(v) {
				tb.Logf("refused, as accounts.conf means to: %s", v)
				continue
			}
			refused = append(refused, v)
		}
		if len(refused) > 0 {
			tb.Errorf("nats servers logged permission violations:\n%s", strings.Join(refused, "\n"))
		}
	})
	// A port found free may be taken before its server binds it (by
	// another test process): then the cluster starts again on other
	// ports, with fresh storage.
	for attempt := 1; ; attempt++ {
		c.nodes = nil
		for i := range n {
			dir, err := os.MkdirTemp(storage, fmt.Sprintf("n%d-", i+1))
			if err != nil {
				tb.Fatal(err)
			}
			nd := &natsNode{name: fmt.Sprintf("n%d", i+1), storeDir: dir, port: freePort(tb)}
			if n > 1 {
				nd.clusterPort = freePort(tb)
			}
			c.nodes = append(c.nodes, nd)
		}
		err := c.startAll()
		if err == nil {
			break
		}
		c.shutdown()
		if !strings.Contains(err.Error(), "address already in use") || attempt == 3 {
			tb.Fatal(err)
		}
		tb.Logf("starting the cluster again on other ports: %v", err)
	}
	c.waitReady()
	return c
}

// startAll starts every node, and returns the first error.
func (c *natsCluster) startAll() error {
	for i := range c.nodes {
		if err := c.startNode(i); err != nil {
			return err
		}
	}
	return nil
}

// options loads node i's configuration: nats.conf for a cluster node,
// deploy/nats/single.conf for a single server, with the environment those
// files read.
func (c *natsCluster) options(i int) *server.Options {
	c.tb.Helper()
	nd := c.nodes[i]
	file := "nats.conf"
	if nd.clusterPort == 0 {
		file = "deploy/nats/single.conf"
	}
	var routes []int
	for _, other := range c.nodes {
		routes = append(routes, other.clusterPort)
	}
	env := confEnv(nd.name, nd.storeDir, nd.port, nd.clusterPort, routes)
	for k, v := range env {
		c.tb.(*testing.T).Setenv(k, v)
	}
	o, err := server.ProcessConfigFile(repoFile(file))
	if err != nil {
		c.tb.Fatalf("load %s: %v", file, err)
	}
	o.NoSigs = true
	return o
}

// start starts node i.
func (c *natsCluster) start(i int) {
	c.tb.Helper()
	if err := c.startNode(i); err != nil {
		c.tb.Fatal(err)
	}
}

// startNode starts node i, or says why it did not.
func (c *natsCluster) startNode(i int) error {
	c.tb.Helper()
	nd := c.nodes[i]
	srv, err := system.StartNATS(system.NATSConfig{Options: c.options(i), Logger: slog.New(c.viol)})
	if err != nil {
		return fmt.Errorf("nats %s: %w", nd.name, err)
	}
	nd.srv = srv
	return nil
}

// kill shuts node i down at once: its clients and routes are cut, its
// JetStream leaders vanish without handing over (no lame duck mode).
func (c *natsCluster) kill(i int) {
	nd := c.nodes[i]
	if nd.srv == nil {
		return
	}
	nd.srv.Shutdown()
	nd.srv.WaitForShutdown()
	nd.srv = nil
}

// restart starts node i again on its ports, with its storage.
func (c *natsCluster) restart(i int) {
	c.tb.Helper()
	c.start(i)
}

func (c *natsCluster) shutdown() {
	for i := range c.nodes {
		c.kill(i)
	}
}

// running returns the servers that run.
func (c *natsCluster) running() []*server.Server {
	var out []*server.Server
	for _, nd := range c.nodes {
		if nd.srv != nil {
			out = append(out, nd.srv)
		}
	}
	return out
}

// urls returns the client URLs of every node, comma-separated, as
// --nats-url takes them.
func (c *natsCluster) urls() string {
	var out []string
	for _, nd := range c.nodes {
		out = append(out, fmt.Sprintf("nats://127.0.0.1:%d", nd.port))
	}
	return strings.Join(out, ",")
}

// flagsAs returns the greendot flags that connect to the cluster as user.
func (c *natsCluster) flagsAs(user string) []string {
	return []string{"--nats-url", c.urls(), "--nats-user", user, "--nats-password", rolePasswords[user]}
}

// urlsAs returns urls with a user's credentials in each URL, for
// in-process services.
func (c *natsCluster) urlsAs(user string) string {
	return strings.ReplaceAll(c.urls(), "nats://", "nats://"+user+":"+rolePasswords[user]+"@")
}

// waitReady waits until the running nodes are routed to each other, one of
// them leads JetStream's meta group and all are current.
func (c *natsCluster) waitReady() {
	c.tb.Helper()
	waitFor(c.tb, 60*time.Second, "nats cluster ready", func() error {
		srvs := c.running()
		leader := false
		for _, s := range srvs {
			if !s.JetStreamEnabled() {
				return fmt.Errorf("%s: jetstream not enabled", s.Name())
			}
			if len(c.nodes) == 1 {
				return nil
			}
			if s.NumRoutes() < len(srvs)-1 {
				return fmt.Errorf("%s has %d routes", s.Name(), s.NumRoutes())
			}
			if !s.JetStreamIsCurrent() {
				return fmt.Errorf("%s is not current", s.Name())
			}
			leader = leader || s.JetStreamIsLeader()
		}
		if !leader {
			return errors.New("no meta leader")
		}
		return nil
	})
}

// streamLeader returns the index of the node leading a stream of the
// global account, or -1.
func (c *natsCluster) streamLeader(stream string) int {
	for i, nd := range c.nodes {
		if nd.srv != nil && nd.srv.JetStreamIsStreamLeader(greendotAccount, stream) {
			return i
		}
	}
	return -1
}

// waitStreamsCurrent waits until every running node is current on every
// bucket's stream, and each stream has a leader.
func (c *natsCluster) waitStreamsCurrent(timeout time.Duration) {
	c.tb.Helper()
	if len(c.nodes) == 1 {
		return
	}
	waitFor(c.tb, timeout, "bucket streams current", func() error {
		for _, b := range []string{presence.ConnsBucket, presence.StatusBucket, presence.GraphBucket} {
			stream := presence.StreamName(b)
			if c.streamLeader(stream) < 0 {
				return fmt.Errorf("%s has no leader", stream)
			}
			for _, s := range c.running() {
				if !s.JetStreamIsStreamCurrent(greendotAccount, stream) {
					return fmt.Errorf("%s is not current on %s", stream, s.Name())
				}
			}
		}
		return nil
	})
}

// greendotAccount is the account of deploy/nats/accounts.conf that holds
// greendot's buckets.
const greendotAccount = "GREENDOT"

// connect returns an operator's connection to the cluster, with the
// reconnect behaviour every greendot process has.
func (c *natsCluster) connect(name string) *nats.Conn {
	c.tb.Helper()
	nc, err := natsconn.Connect(natsconn.Options{URL: c.urls(), Name: name, User: "operator", Password: rolePasswords["operator"], Logger: testLogger(c.tb, name)})
	if err != nil {
		c.tb.Fatal(err)
	}
	c.tb.Cleanup(nc.Close)
	return nc
}

// openStore creates greendot's buckets with the given replicas, as
// `greendot buckets` does, and returns a store over an operator's
// connection.
func (c *natsCluster) openStore(replicas int) *presence.Store {
	c.tb.Helper()
	nc := c.connect("faulttest operator")
	var store *presence.Store
	// Right after the cluster formed, placing three replicas can fail
	// for a moment.
	waitFor(c.tb, 60*time.Second, "create buckets", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		store, err = presence.Open(ctx, nc, presence.BucketOptions{Replicas: replicas})
		return err
	})
	c.waitStreamsCurrent(60 * time.Second)
	return store
}

// --- In-process services ---------------------------------------------------

// stopAtEnd stops p when the test ends: it cancels the service, waits for
// it to return, and closes its connection.
func stopAtEnd(tb testing.TB, p *system.Proc) {
	tb.Cleanup(func() {
		if err := p.Stop(60 * time.Second); err != nil {
			tb.Errorf("%v", err)
		}
	})
}

// conn says how an in-process service named name connects to urls.
func conn(tb testing.TB, name, urls string) natsconn.Options {
	return natsconn.Options{URL: urls, Name: name, Logger: testLogger(tb, name)}
}

// gatewayConfig is the gateway configuration of the fault tests: dev auth,
// short batches, and the given timings.
func gatewayConfig(tb testing.TB, id string, t timings) gateway.Config {
	cfg := gateway.Config{
		Logger:            testLogger(tb, id),
		Buckets:           presence.BucketOptions{Replicas: t.replicas},
		ID:                id,
		ConnTTL:           t.ttl,
		HeartbeatInterval: t.heartbeat,
		OfflineGrace:      t.grace,
		BatchInterval:     10 * time.Millisecond,
		DevAuth:           true,
		DrainPeriod:       t.drain,
	}
	if t.edit != nil {
		t.edit(&cfg)
	}
	return cfg
}

// startGateway runs a gateway in the test process on a loopback listener,
// until the test ends.
func startGateway(tb testing.TB, urls, id string, t timings) *system.Gateway {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	g, err := system.StartGateway(conn(tb, id, urls), gatewayConfig(tb, id, t), ln)
	if err != nil {
		tb.Fatal(err)
	}
	stopAtEnd(tb, g.Proc)
	if err := g.AwaitReady(context.Background(), 60*time.Second); err != nil {
		tb.Fatal(err)
	}
	return g
}

// startReaper runs a reaper in the test process, until the test ends.
func startReaper(tb testing.TB, urls, name string, t timings) *system.Proc {
	tb.Helper()
	p, err := system.StartReaper(conn(tb, name, urls), reaper.Config{
		Logger:        testLogger(tb, name),
		Buckets:       presence.BucketOptions{Replicas: t.replicas},
		SweepInterval: cmp.Or(t.sweep, 5*time.Second),
		AckWait:       t.ackWait,
	})
	if err != nil {
		tb.Fatal(err)
	}
	stopAtEnd(tb, p)
	return p
}

// startFanout runs a fanout in the test process, until the test ends.
func startFanout(tb testing.TB, urls, name string, t timings) *system.Proc {
	tb.Helper()
	p, err := system.StartFanout(conn(tb, name, urls), fanout.Config{
		Logger:  testLogger(tb, name),
		Buckets: presence.BucketOptions{Replicas: t.replicas},
		AckWait: t.ackWait,
	})
	if err != nil {
		tb.Fatal(err)
	}
	stopAtEnd(tb, p)
	return p
}

// timings are the settings a fault test runs its system with.
type timings struct {
	ttl, heartbeat, grace, drain, ackWait time.Duration
	// sweep is the reapers' sweep interval; zero means 5s.
	sweep    time.Duration
	replicas int
	// edit, when set, changes an in-process gateway's configuration.
	edit func(*gateway.Config)
}

// gatewayArgs returns the command line flags of a child gateway with t.
func (t timings) gatewayArgs() []string {
	args := []string{
		"--conn-ttl", t.ttl.String(),
		"--heartbeat-interval", t.heartbeat.String(),
		"--offline-grace", t.grace.String(),
		"--batch-interval", "10ms",
		"--replicas", fmt.Sprint(t.replicas),
	}
	if t.drain > 0 {
		args = append(args, "--drain-period", t.drain.String())
	}
	return args
}

// --- Child processes of the greendot binary -------------------------------

// startChild runs `greendot args...` with JSON logs, kept in memory and
// shown when the test fails. It is killed when the test ends, if it still
// runs.
func startChild(tb testing.TB, name string, args ...string) *system.Child {
	tb.Helper()
	o := system.ChildOptions{
		Name: name,
		Path: greendotBinary(tb),
		Args: append(args, "--log-format", "json", "--log-level", "debug"),
		Env:  append(os.Environ(), "GREENDOT_NATS_PASSWORD=", "GREENDOT_NATS_USER="),
	}
	if testlog.Verbose {
		o.Echo = os.Stderr
	}
	c, err := system.StartChild(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = c.Kill()
		if tb.Failed() {
			lines := c.Lines()
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			tb.Logf("last log lines of %s:\n%s", name, strings.Join(lines, "\n"))
		}
	})
	return c
}

// kill ends c with SIGKILL, waits until it is gone, and fails the test if
// it had exited with an error before.
func kill(tb testing.TB, c *system.Child) {
	tb.Helper()
	if err := c.Kill(); err != nil {
		tb.Errorf("%s: %v", c.Name(), err)
	}
}

// logField waits until c logs a line with message msg and returns the
// value of its attribute key.
func logField(tb testing.TB, c *system.Child, timeout time.Duration, msg, key string) string {
	tb.Helper()
	var val string
	waitFor(tb, timeout, fmt.Sprintf("%s logs %q", c.Name(), msg), func() error {
		if done, err := c.Exited(); done {
			return fmt.Errorf("exited: %v", err)
		}
		for _, l := range c.Lines() {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) != nil || m["msg"] != msg {
				continue
			}
			val = fmt.Sprint(m[key])
			return nil
		}
		return errors.New("not yet")
	})
	return val
}

// startChildGateway runs a gateway child process with dev auth on a
// loopback port, as the cluster's user "gateway", and returns it with its
// WebSocket URL.
func startChildGateway(tb testing.TB, cl *natsCluster, id string, t timings) (*system.Child, string) {
	tb.Helper()
	args := append([]string{"gateway", "--listen", "127.0.0.1:0", "--dev-auth", "--gateway-id", id}, cl.flagsAs("gateway")...)
	c := startChild(tb, id, append(args, t.gatewayArgs()...)...)
	addr := logField(tb, c, 60*time.Second, "gateway serving", "addr")
	return c, "ws://" + addr + gateway.WebSocketPath
}

// startChildWorker runs a reaper or fanout child process, as the
// cluster's user of its kind, and waits until it consumes.
func startChildWorker(tb testing.TB, cl *natsCluster, kind, name string, t timings) *system.Child {
	tb.Helper()
	args := append([]string{kind, "--replicas", fmt.Sprint(t.replicas), "--ack-wait", t.ackWait.String()}, cl.flagsAs(kind)...)
	if kind == "reaper" {
		args = append(args, "--sweep-interval", cmp.Or(t.sweep, 5*time.Second).String())
	}
	c := startChild(tb, name, args...)
	logField(tb, c, 60*time.Second, kind+" running", "bucket")
	return c
}
