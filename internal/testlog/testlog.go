// Package testlog gives the services a test runs a logger whose lines
// reach the test's own output: go test shows them with a test that fails
// (and with -v), so that a failure seen once, in CI or on a loaded
// machine, comes with what the gateways, reapers and fanouts said while
// it happened. With GREENDOT_TEST_LOG set, every line of every level goes
// to standard error as it is written instead, for watching a test run.
package testlog

import (
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
)

// Verbose reports whether GREENDOT_TEST_LOG is set: logs stream to
// standard error, at every level.
var Verbose = os.Getenv("GREENDOT_TEST_LOG") != ""

// New returns a logger for a service that tb runs. Unless Verbose, it
// writes lines of level Info and above to tb's output, where go test
// keeps them until it knows whether tb failed; a line logged once tb's
// cleanups have run (by a goroutine that outlived its test) is dropped,
// as the testing package forbids writing it. args are added to every
// line, as slog.Logger.With adds them.
func New(tb testing.TB, args ...any) *slog.Logger {
	if Verbose {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With(args...)
	}
	w := &output{out: tb.Output()}
	// Registered now, it runs after the cleanups registered later: those
	// that stop the services this logger is for.
	tb.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})).With(args...)
}

// output writes to a test's output until its test ends.
type output struct {
	mu     sync.Mutex
	out    io.Writer
	closed bool
}

// Write writes p to the test's output, or drops it once close was called.
func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return len(p), nil
	}
	return o.out.Write(p)
}

func (o *output) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
}
