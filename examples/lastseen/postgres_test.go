package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/syncbuf"
	"github.com/greendot/greendot/internal/tooltest"
)

// postgresBin finds the directory of initdb and postgres: on PATH, or
// where Debian's packages put them.
func postgresBin() (string, bool) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p), true
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		return "", false
	}
	dir := filepath.Dir(matches[len(matches)-1])
	if _, err := os.Stat(filepath.Join(dir, "postgres")); err != nil {
		return "", false
	}
	return dir, true
}

// startPostgres creates a PostgreSQL cluster in a temporary directory,
// starts a server on a Unix socket there (no TCP), and returns a pool of
// connections to it. The server stops when the test ends. Without
// PostgreSQL the test is skipped, unless CI=true, where it fails. As root
// the cluster belongs to, and the server runs as, the postgres user, since
// PostgreSQL refuses to run as root.
func startPostgres(t *testing.T) *pgxpool.Pool {
	t.Helper()
	bin, ok := postgresBin()
	if !ok {
		tooltest.Missing(t, "PostgreSQL is not installed (initdb and postgres not found): install the postgresql package")
	}
	dir := t.TempDir()
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = postgresUser(t, dir)
	}
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "LC_ALL=C", "HOME=" + dir}
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		return cmd
	}

	data := filepath.Join(dir, "data")
	if out, err := run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	var log syncbuf.Buffer
	srv := run("postgres", "-D", data, "-k", dir, "-c", "listen_addresses=", "-c", "fsync=off",
		"-c", "full_page_writes=off", "-c", "synchronous_commit=off")
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		// SIGINT is the fast shutdown: clients are disconnected, nothing waits.
		_ = srv.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			<-exited
			t.Errorf("postgres did not stop within 30s of SIGINT; log:\n%s", log.String())
		}
	})

	pool, err := pgxpool.New(context.Background(), "host="+dir+" user=postgres dbname=postgres sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	natstest.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("postgres exited: %v; log:\n%s", err, log.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return pool.Ping(ctx)
	})
	return pool
}

// postgresUser makes dir the postgres user's, and every directory above it
// up to the system's temporary directory traversable, and returns the
// credential to run PostgreSQL's programs with.
func postgresUser(t *testing.T, dir string) *syscall.Credential {
	t.Helper()
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("running as root, PostgreSQL needs the postgres user: %v", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("postgres user %s:%s: not numeric ids", u.Uid, u.Gid)
	}
	if err := os.Chown(dir, int(uid), int(gid)); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Clean(os.TempDir())
	for d := filepath.Dir(dir); d != tmp && d != filepath.Dir(d); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, fi.Mode().Perm()|0o111); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(tmp); err != nil || fi.Mode().Perm()&0o001 == 0 {
		t.Fatalf("%s is not traversable by the postgres user (%v)", tmp, fmt.Sprint(err))
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}
