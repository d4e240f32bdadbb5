package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/freeport"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/syncbuf"
)

// proc is a command running in the test process, as main runs it.
type proc struct {
	args           []string
	stdout, stderr *syncbuf.Buffer
	cancel         context.CancelFunc
	done           chan int
	code           int
	exited         bool
}

// start runs the command line args (without the program name) until the
// test stops it or ends. It returns once the command has written its first
// output or exited, which is after it has parsed its flags: urfave/cli
// writes to its package-level help and version flags while parsing, so
// two commands of one test process must not parse at the same time.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{args: args, stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, cancel: cancel, done: make(chan int, 1)}
	go func() { p.done <- run(ctx, append([]string{"greendot"}, args...), p.stdout, p.stderr) }()
	t.Cleanup(func() {
		if !p.exited {
			p.stop(t)
		}
	})
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for p.stdout.String() == "" && p.stderr.String() == "" {
		select {
		case p.code = <-p.done:
			p.exited = true
			return p
		case <-deadline:
			t.Fatalf("greendot %s wrote nothing within 20s", strings.Join(args, " "))
		case <-tick.C:
		}
	}
	return p
}

// stop cancels the command's context, as SIGINT does, and returns its exit
// code. It fails the test if the command does not return within 20s.
func (p *proc) stop(t *testing.T) int {
	t.Helper()
	p.cancel()
	return p.wait(t, 20*time.Second)
}

// wait waits for the command to return on its own.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	if p.exited {
		return p.code
	}
	select {
	case p.code = <-p.done:
		p.exited = true
	case <-time.After(timeout):
		t.Fatalf("greendot %s did not return within %v; stderr:\n%s", strings.Join(p.args, " "), timeout, p.stderr)
	}
	return p.code
}

// awaitOutput waits until the command's stdout matches re, and returns the
// submatches.
func (p *proc) awaitOutput(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	var m []string
	natstest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if m = re.FindStringSubmatch(p.stdout.String()); m != nil {
			return nil
		}
		if p.exited { // before start returned
			t.Fatalf("greendot %s exited with %d; stderr:\n%s", strings.Join(p.args, " "), p.code, p.stderr)
		}
		select {
		case code := <-p.done:
			p.code, p.exited = code, true
			t.Fatalf("greendot %s exited with %d; stderr:\n%s", strings.Join(p.args, " "), code, p.stderr)
		default:
		}
		return fmt.Errorf("stdout %q does not match %v", p.stdout.String(), re)
	})
	return m
}

// runOnce runs a command that ends by itself and returns its exit code and
// output.
func runOnce(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := start(t, args...)
	code = p.wait(t, 30*time.Second)
	return code, p.stdout.String(), p.stderr.String()
}

// freeAddr returns a loopback address with a port that was free a moment
// ago, for flags that need a fixed port.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{}, {"--help"}, {"standalone", "--help"}, {"gateway", "--help"}, {"graph", "--help"}, {"graph", "show", "--help"}, {"--version"}} {
		code, stdout, stderr := runOnce(t, args...)
		if code != 0 || stdout == "" {
			t.Errorf("greendot %v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	_, stdout, _ := runOnce(t, "gateway", "--help")
	for _, want := range []string{"--conn-ttl value", "(default: 30s)", "[$GREENDOT_CONN_TTL]", "(default: 15s, or half of --conn-ttl when that is shorter)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("gateway --help lacks %q:\n%s", want, stdout)
		}
	}
}
