package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/internal/freeport"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/syncbuf"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system"
	"github.com/greendot/greendot/system/systest"
	"github.com/greendot/greendot/webhook"
)

// sameSQL reports whether two statements are the same but for the white
// space at the start and end of their lines and a final semicolon.
func sameSQL(a, b string) bool {
	norm := func(s string) string {
		var lines []string
		for l := range strings.Lines(strings.TrimSuffix(strings.TrimSpace(s), ";")) {
			lines = append(lines, strings.TrimSpace(l))
		}
		return strings.Join(lines, "\n")
	}
	return norm(a) == norm(b)
}

// TestDocSamples runs the worked example of docs/integration.md: its
// table and write are Schema and upsert, which TestReceiver runs; its Go
// is main.go's, which this test runs, serving a signed delivery into
// PostgreSQL that pushOffline logs; and its psql query, run on the row,
// prints the columns the page shows.
func TestDocSamples(t *testing.T) {
	if b := doctest.Sample(t, "docs/integration.md", "CREATE TABLE IF NOT EXISTS user_last_seen"); !sameSQL(b.Text, Schema) {
		t.Errorf("%s is not Schema:\n%s", b, Schema)
	}
	if b := doctest.Sample(t, "docs/integration.md", "WITH before AS"); !sameSQL(b.Text, upsert) {
		t.Errorf("%s is not upsert:\n%s", b, upsert)
	}
	doctest.Verbatim(t, doctest.Sample(t, "docs/integration.md", "pool, err := pgxpool.New("), "main.go")
	doctest.Verbatim(t, doctest.Sample(t, "docs/integration.md", "func pushOffline("), "main.go")

	pool := startPostgres(t)
	addr := freeAddr(t)
	logs := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, addr, pool.Config().ConnString(), secret, slog.New(slog.NewTextHandler(logs, nil)))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("run: %v", err)
		}
	}()
	offline := webhook.Event{UserID: "alice", Status: presence.Offline, LastSeen: 1_795_430_523, Rev: 12, At: time.Now().UnixMilli()}
	natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		select {
		case err := <-done:
			t.Fatalf("run ended: %v\n%s", err, logs)
		default:
		}
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			return err
		}
		return resp.Body.Close()
	})
	if code := post(t, "http://"+addr+"/hooks/presence", secret, time.Now(), offline); code != http.StatusNoContent {
		t.Fatalf("a signed delivery: %d, want 204\n%s", code, logs)
	}
	if !strings.Contains(logs.String(), `msg="push: user went offline" user_id=alice last_seen=2026-11-23T10:42:03Z rev=12`) {
		t.Errorf("pushOffline logged:\n%s", logs)
	}

	psql, err := exec.LookPath("psql")
	if err != nil {
		tooltest.Missing(t, "no psql for the query of docs/integration.md: install the postgresql-client package")
		return
	}
	query := doctest.Sample(t, "docs/integration.md", "psql \"$DATABASE_URL\"")
	cmd := exec.Command("bash", "-c", strings.Replace(query.Text, "psql", psql, 1))
	cmd.Env = append(os.Environ(), "DATABASE_URL="+pool.Config().ConnString())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", query, err, out)
	}
	shown := doctest.Sample(t, "docs/integration.md", "user_id | status")
	if got, want := columns(firstLine(string(out))), columns(firstLine(shown.Text)); got != want {
		t.Errorf("psql printed the columns %s, %s shows %s", got, shown, want)
	}
	if !strings.Contains(string(out), " alice   | offline |       0 |") {
		t.Errorf("psql printed no row of alice offline:\n%s", out)
	}
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

// columns returns the names of a psql header line.
func columns(header string) string {
	var names []string
	for f := range strings.SplitSeq(header, "|") {
		names = append(names, strings.TrimSpace(f))
	}
	return fmt.Sprint(names)
}

// asMain, set in the environment, has the test binary run as the
// command lastseen: TestRunItSample runs it so.
const asMain = "LASTSEEN_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRunItSample runs the "Run it" commands of docs/integration.md with
// bash, with the test's PostgreSQL and free ports in place of the page's,
// this test binary as go run ./examples/lastseen, and a greendot built
// from the module, given a data directory of its own and no NATS port:
// alice connects and closes, and her row says offline.
func TestRunItSample(t *testing.T) {
	sample := doctest.Sample(t, "docs/integration.md", "export DATABASE_URL=")
	bash, err := exec.LookPath("bash")
	if err != nil {
		tooltest.Missing(t, "no bash to run the commands of docs/integration.md with: install it (apt-get install -y bash)")
		return
	}
	pool := startPostgres(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	greendot := filepath.Join(dir, "greendot")
	if err := system.Build(ctx, greendot, system.Greendot); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	hooksAddr, gwAddr := freeAddr(t), freeAddr(t)
	script := strings.NewReplacer(
		"postgres://app@localhost/app", "'"+pool.Config().ConnString()+"'",
		"127.0.0.1:8090", hooksAddr,
		"go run ./examples/lastseen", "'"+self+"'",
		"greendot standalone", "'"+greendot+"' standalone --data greendot-data --listen "+gwAddr+" --nats-listen ''",
	).Replace(sample.Text)
	cmd := exec.Command(bash, "-e", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), asMain+"=1")
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			t.Errorf("the commands did not end within 30s of SIGTERM:\n%s", out)
		}
	}()
	natstest.CheckFor(t, 2*time.Minute, 50*time.Millisecond, func() error {
		select {
		case err := <-exited:
			t.Fatalf("the commands ended: %v\n%s", err, out)
		default:
		}
		resp, err := http.Get("http://" + gwAddr + "/readyz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
	alice, err := client.Dial(ctx, "ws://"+gwAddr+"/ws?user=alice", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stop := systest.KeepAlive(alice, 300*time.Millisecond)
	natstest.CheckFor(t, time.Minute, 50*time.Millisecond, func() error {
		if r, ok := readRow(t, pool, "alice"); !ok || r.Status != "online" {
			return fmt.Errorf("alice's row: %+v; the commands printed:\n%s", r, out)
		}
		return nil
	})
	stop()
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, time.Minute, 50*time.Millisecond, func() error {
		if r, _ := readRow(t, pool, "alice"); r.Status != "offline" {
			return fmt.Errorf("alice's row: %+v; the commands printed:\n%s", r, out)
		}
		return nil
	})
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
