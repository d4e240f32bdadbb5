package system

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/natstest"
)

// helperEnv, set to a mode, makes the test binary act as a child process
// for these tests instead of running them.
const helperEnv = "GREENDOT_SYSTEM_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(m.Run())
}

// helper is the child process of the tests, by mode:
//
//	echo     says "started" on stderr, then writes every line of stdin
//	         back on stdout until stdin ends, then exits 0
//	wait     says "waiting" on stderr and exits 0 on SIGTERM
//	deaf     ignores SIGTERM, says "deaf" on stderr and waits for stdin to end
//	fail     says "boom" on stderr and exits 3
func helper(mode string) int {
	switch mode {
	case "echo":
		fmt.Fprintln(os.Stderr, "started")
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			fmt.Println(sc.Text())
		}
		return 0
	case "wait":
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, "waiting")
		<-sigs
		return 0
	case "deaf":
		signal.Ignore(syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, "deaf")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		return 0
	case "fail":
		fmt.Fprintln(os.Stderr, "boom")
		return 3
	}
	return 2
}

// helperOptions returns the options of a child that is this test binary
// in mode.
func helperOptions(t *testing.T, name, mode string) ChildOptions {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return ChildOptions{Name: name, Path: exe, Env: append(os.Environ(), helperEnv+"="+mode)}
}

// startHelper starts a child that is this test binary in mode; it is
// killed when the test ends.
func startHelper(t *testing.T, o ChildOptions) *Child {
	t.Helper()
	c, err := StartChild(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Kill() })
	return c
}

// awaitLine waits until the child has logged line on stderr (kept in
// memory).
func awaitLine(t *testing.T, c *Child, line string) {
	t.Helper()
	checkFor(t, 30*time.Second, func() error {
		for _, l := range c.Lines() {
			if l == line {
				return nil
			}
		}
		if done, err := c.Exited(); done {
			return fmt.Errorf("exited (%v) without %q: %q", err, line, c.Lines())
		}
		return fmt.Errorf("no %q yet: %q", line, c.Lines())
	})
}

// checkFor calls f every 10ms until it returns nil, or fails the test
// with its last error after total.
func checkFor(t *testing.T, total time.Duration, f func() error) {
	t.Helper()
	natstest.CheckFor(t, total, 10*time.Millisecond, f)
}

// capture returns a writer that is safe for concurrent use, and a
// function that returns what was written to it.
func capture() (io.Writer, func() string) {
	var (
		mu sync.Mutex
		b  strings.Builder
	)
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return b.Write(p)
	})
	return w, func() string {
		mu.Lock()
		defer mu.Unlock()
		return b.String()
	}
}

// TestChildStopOnSignal stops a child that exits cleanly on SIGTERM, and
// keeps its stderr in memory and echoes it.
func TestChildStopOnSignal(t *testing.T) {
	o := helperOptions(t, "waiter", "wait")
	var echoed func() string
	o.Echo, echoed = capture()
	c := startHelper(t, o)
	awaitLine(t, c, "waiting")
	if done, _ := c.Exited(); done {
		t.Fatal("exited before its stop")
	}
	if c.Pid() <= 0 {
		t.Errorf("pid %d", c.Pid())
	}
	if err := c.Stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("Stop = %v, want nil", err)
	}
	if done, err := c.Exited(); !done || err != nil {
		t.Errorf("Exited = %v, %v; want true, nil", done, err)
	}
	if got, want := echoed(), "[waiter] waiting\n"; got != want {
		t.Errorf("echo %q, want %q", got, want)
	}
}

// TestChildKilledAfterTimeout stops a child that ignores SIGTERM: it is
// killed once the timeout has passed.
func TestChildKilledAfterTimeout(t *testing.T) {
	o := helperOptions(t, "deaf", "deaf")
	o.Stdin = true
	c := startHelper(t, o)
	awaitLine(t, c, "deaf")
	if err := c.Wait(100 * time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Errorf("Wait = %v, want ErrTimeout", err)
	}
	err := c.Stop(syscall.SIGTERM, 200*time.Millisecond)
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("Stop = %v, want ErrTimeout", err)
	}
	if done, _ := c.Exited(); !done {
		t.Error("still runs after Stop")
	}
}

// TestChildFailure reports how a child that fails exited, with its log in
// a file that a second start appends to.
func TestChildFailure(t *testing.T) {
	o := helperOptions(t, "failing", "fail")
	o.Log = filepath.Join(t.TempDir(), "failing.log")
	c := startHelper(t, o)
	err := c.Wait(30 * time.Second)
	var code interface{ ExitCode() int }
	if !errors.As(err, &code) || code.ExitCode() != 3 {
		t.Fatalf("Wait = %v, want exit status 3", err)
	}
	if got := c.Stop(syscall.SIGTERM, time.Second); got == nil || got.Error() != err.Error() {
		t.Errorf("Stop after the exit = %v, want %v", got, err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(30 * time.Second); err == nil {
		t.Error("second start exited cleanly")
	}
	if got, want := c.Tail(), "boom\nboom"; got != want {
		t.Errorf("Tail = %q, want %q", got, want)
	}
	if lines := c.Lines(); len(lines) != 0 {
		t.Errorf("Lines = %q with a log file, want none", lines)
	}
}

// TestChildPipes talks to a child over its stdin and stdout.
func TestChildPipes(t *testing.T) {
	got := make(chan string, 10)
	o := helperOptions(t, "echo", "echo")
	o.Stdin = true
	o.OnStdout = func(line []byte) { got <- string(line) }
	c := startHelper(t, o)
	if err := c.Start(); err == nil {
		t.Error("a second Start while it runs succeeded")
	}
	for _, msg := range []string{"one", "two"} {
		if _, err := fmt.Fprintln(c.Stdin(), msg); err != nil {
			t.Fatal(err)
		}
		select {
		case line := <-got:
			if line != msg {
				t.Errorf("read %q, want %q", line, msg)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no echo of %q", msg)
		}
	}
	if err := c.Stdin().Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(30 * time.Second); err != nil {
		t.Errorf("exit after the end of stdin: %v", err)
	}
	if got, want := c.Tail(), "started"; got != want {
		t.Errorf("Tail = %q, want %q", got, want)
	}
}

// writerFunc is an io.Writer made of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
