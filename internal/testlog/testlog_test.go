package testlog_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/greendot/greendot/internal/testlog"
)

// recorder is a testing.TB whose output is a buffer and whose cleanups
// run when the test says.
type recorder struct {
	testing.TB
	out      bytes.Buffer
	cleanups []func()
}

func (r *recorder) Output() io.Writer { return &r.out }
func (r *recorder) Cleanup(fn func()) { r.cleanups = append(r.cleanups, fn) }

// end runs the cleanups, the last registered first, as testing does.
func (r *recorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestLinesReachTheTestsOutputUntilItEnds(t *testing.T) {
	if testlog.Verbose {
		t.Skip("GREENDOT_TEST_LOG is set: lines go to standard error")
	}
	r := &recorder{TB: t}
	log := testlog.New(r, "proc", "gw-1")
	log.Debug("heartbeat read")
	log.Info("gateway serving", "addr", "127.0.0.1:1")
	log.Warn("register connection", "user_id", "bob")
	r.end()
	log.Error("after the test")

	got := r.out.String()
	for _, want := range []string{
		`level=INFO msg="gateway serving" proc=gw-1 addr=127.0.0.1:1`,
		`level=WARN msg="register connection" proc=gw-1 user_id=bob`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"heartbeat read", "after the test"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("output has %q:\n%s", unwanted, got)
		}
	}
	if n := strings.Count(got, "\n"); n != 2 {
		t.Errorf("%d lines, want 2:\n%s", n, got)
	}
}
