// Package tooltest is for the tests of this repository that need a tool
// from outside Go (Node.js and npm packages, Chromium, PostgreSQL, Python):
// where it is missing, such a test fails in CI, where every test must
// run, and is skipped elsewhere, so that go test ./... passes on a fresh
// machine, saying on one line what it did not test. The long suites are
// skipped the same way outside CI (Long).
package tooltest

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Missing ends the test tb for want of a tool, with msg, which says what is
// missing and how to install it: it fails the test when the environment
// variable CI is "true" (as CI sets it), and skips it otherwise.
//
// go test shows a skipped test's message only with -v. So that a run
// without it still says what it did not test, the first skip of each msg
// in a test binary is also written on one line, "<package dir>: skipped:
// <msg>", to the terminal go test runs in: the one output go test does
// not hold back for a package that passes. Without a terminal (CI, an
// editor) only -v shows it.
func Missing(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
		return
	}
	sayOnce(msg)
	tb.Skip(msg)
}

// LongEnv is the environment variable that has go test run the long
// suites (the fault suite, the load generator's smoke run, the end-to-end
// invariant) outside CI, as GREENDOT_LONG_TESTS=1 go test ./... does.
const LongEnv = "GREENDOT_LONG_TESTS"

// Long skips tb, one of the long suites, unless CI is "true" or LongEnv
// is 1, so that go test ./... stays within a few minutes; CI runs every
// one of them. As with Missing, a run without -v says so on one line.
func Long(tb testing.TB) {
	tb.Helper()
	if os.Getenv("CI") == "true" || os.Getenv(LongEnv) == "1" {
		return
	}
	msg := "a long suite, run by CI and by " + LongEnv + "=1 go test ./..."
	sayOnce(msg)
	tb.Skip(msg)
}

// Where the line of a skip goes, and whether -v shows it already: a test
// replaces them.
var (
	terminal = func() (io.WriteCloser, error) { return os.OpenFile("/dev/tty", os.O_WRONLY, 0) }
	verbose  = testing.Verbose
)

var said struct {
	sync.Mutex
	msgs map[string]bool
}

// sayOnce writes the line of a skip with msg to the terminal, unless this
// test binary wrote it already or -v shows the skip.
func sayOnce(msg string) {
	if verbose() {
		return
	}
	said.Lock()
	defer said.Unlock()
	if said.msgs[msg] {
		return
	}
	if said.msgs == nil {
		said.msgs = make(map[string]bool)
	}
	said.msgs[msg] = true
	tty, err := terminal()
	if err != nil {
		return // no terminal: -v shows it
	}
	_, _ = fmt.Fprintf(tty, "%s: skipped: %s\n", packageDir(), msg)
	_ = tty.Close()
}

// packageDir names the test's package by its directory from the
// repository's root (examples/node), as go test runs a test binary in
// its package's directory.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "?"
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if rel, err := filepath.Rel(dir, wd); err == nil {
				return filepath.ToSlash(rel)
			}
			return wd
		}
		up := filepath.Dir(dir)
		if up == dir {
			return wd
		}
		dir = up
	}
}
