package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/syncbuf"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/version"
)

// TestVersion: greendot --version prints the one version of the build,
// the one the micro services report.
func TestVersion(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runOnce(t, "--version")
	if want := "greendot version " + version.String() + "\n"; code != 0 || stdout != want {
		t.Errorf("--version: exit %d, stdout %q, stderr %q; want %q", code, stdout, stderr, want)
	}
}

// TestStampedVersion builds the binary the way the Dockerfile does, with
// the version stamped by -ldflags -X, and checks that --version and the
// reaper's micro service both report the stamped version.
func TestStampedVersion(t *testing.T) {
	t.Parallel()
	dockerfile, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`-X (\S+)=\$\{VERSION\}`).FindSubmatch(dockerfile)
	if m == nil {
		t.Fatal("the Dockerfile stamps no version with -X <variable>=${VERSION}")
	}
	const stamped = "1.2.3-stamped"
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "greendot")
	build := exec.Command(goTool, "build", "-ldflags", fmt.Sprintf("-X %s=%s", m[1], stamped), "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	out, err := exec.Command(bin, "--version").CombinedOutput()
	if want := "greendot version " + stamped + "\n"; err != nil || string(out) != want {
		t.Errorf("--version: %q, %v; want %q", out, err, want)
	}

	srv := natstest.RunServer(t)
	reaper := exec.Command(bin, "reaper", "--nats-url", srv.ClientURL())
	var logs syncbuf.Buffer
	reaper.Stdout, reaper.Stderr = &logs, &logs
	if err := reaper.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- reaper.Wait() }()
	t.Cleanup(func() {
		_ = reaper.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = reaper.Process.Kill()
			<-exited
			t.Errorf("the reaper did not stop within 20s of SIGTERM; its log:\n%s", logs.String())
		}
	})
	nc := natstest.Connect(t, srv)
	natstest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		infos, err := adminclient.GatherJSON[admin.Info](context.Background(), nc, admin.ReaperInfoSubject, nil,
			adminclient.GatherOptions{Want: 1, Timeout: 2 * time.Second})
		if err != nil || len(infos) != 1 {
			return fmt.Errorf("reaper info: %+v, %v; log:\n%s", infos, err, logs.String())
		}
		if infos[0].Version != stamped {
			t.Fatalf("the reaper reports version %q, want the stamped %q", infos[0].Version, stamped)
		}
		return nil
	})
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("the reaper logged errors:\n%s", logs.String())
	}
}
