package tooltest_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/greendot/greendot/internal/tooltest"
)

// recorder is a testing.TB that notes the calls of Fatal and Skip instead
// of ending the test.
type recorder struct {
	testing.TB
	calls []string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatal(args ...any) { r.calls = append(r.calls, "Fatal: "+fmt.Sprint(args...)) }

func (r *recorder) Skip(args ...any) { r.calls = append(r.calls, "Skip: "+fmt.Sprint(args...)) }

// tty is a terminal that keeps what is written to it.
type tty struct{ bytes.Buffer }

func (*tty) Close() error { return nil }

// TestMissing fails the test when CI is "true" and skips it otherwise, with
// the message as given, once.
func TestMissing(t *testing.T) {
	const msg = "no frobnicator: install it (apt-get install -y frobnicator, 100%)"
	for _, tt := range []struct {
		ci   string
		want string
	}{
		{"true", "Fatal: " + msg},
		{"", "Skip: " + msg},
		{"false", "Skip: " + msg},
		{"1", "Skip: " + msg},
	} {
		t.Run(fmt.Sprintf("CI=%q", tt.ci), func(t *testing.T) {
			defer tooltest.SetTerminal(&tty{}, false)()
			t.Setenv("CI", tt.ci)
			r := &recorder{TB: t}
			tooltest.Missing(r, msg)
			if want := []string{tt.want}; !slices.Equal(r.calls, want) {
				t.Errorf("calls %q, want %q", r.calls, want)
			}
		})
	}
}

// TestMissingSaysSoOnce: without -v, the first skip of each message writes
// one line naming the package to the terminal; a test that fails in CI
// writes none, and with -v (which shows the skips) none is written.
func TestMissingSaysSoOnce(t *testing.T) {
	const node, chromium = "no Node.js: install it", "no Chromium: install it"
	t.Setenv("CI", "")
	term := &tty{}
	restore := tooltest.SetTerminal(term, false)
	for _, msg := range []string{node, node, chromium, node} {
		tooltest.Missing(&recorder{TB: t}, msg)
	}
	restore()
	want := "internal/tooltest: skipped: " + node + "\ninternal/tooltest: skipped: " + chromium + "\n"
	if term.String() != want {
		t.Errorf("the terminal got %q, want %q", term.String(), want)
	}

	for _, tt := range []struct {
		name, ci string
		verbose  bool
	}{
		{"in CI", "true", false},
		{"with -v", "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			term := &tty{}
			defer tooltest.SetTerminal(term, tt.verbose)()
			tooltest.Missing(&recorder{TB: t}, node)
			if term.Len() != 0 {
				t.Errorf("the terminal got %q, want nothing", term.String())
			}
		})
	}

	// Without a terminal, nothing is written and the test skips all the same.
	defer tooltest.SetTerminal(nil, false)()
	r := &recorder{TB: t}
	tooltest.Missing(r, node)
	if len(r.calls) != 1 || !strings.HasPrefix(r.calls[0], "Skip: ") {
		t.Errorf("calls %q, want one Skip", r.calls)
	}
}

// TestLong runs a long suite in CI and with GREENDOT_LONG_TESTS=1, and
// skips it otherwise, saying so once on the terminal.
func TestLong(t *testing.T) {
	for _, tt := range []struct {
		ci, long string
		skip     bool
	}{
		{"true", "", false},
		{"", "1", false},
		{"true", "1", false},
		{"", "", true},
		{"false", "0", true},
	} {
		t.Run(fmt.Sprintf("CI=%q,%s=%q", tt.ci, tooltest.LongEnv, tt.long), func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			t.Setenv(tooltest.LongEnv, tt.long)
			term := &tty{}
			defer tooltest.SetTerminal(term, false)()
			r := &recorder{TB: t}
			tooltest.Long(r)
			tooltest.Long(r)
			if !tt.skip {
				if len(r.calls) != 0 || term.Len() != 0 {
					t.Errorf("calls %q, terminal %q, want neither", r.calls, term.String())
				}
				return
			}
			if len(r.calls) != 2 || !strings.HasPrefix(r.calls[0], "Skip: a long suite") {
				t.Errorf("calls %q, want two skips of a long suite", r.calls)
			}
			if want := "internal/tooltest: skipped: a long suite, run by CI and by GREENDOT_LONG_TESTS=1 go test ./...\n"; term.String() != want {
				t.Errorf("the terminal got %q, want %q", term.String(), want)
			}
		})
	}
}
