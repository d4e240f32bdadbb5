// Package tooltest is for the tests of this repository that need a tool
// from outside Go (Node.js and npm packages, Chromium, PostgreSQL): where
// it is missing, such a test fails in CI, where every test must run, and
// is skipped elsewhere, so that go test ./... passes on a fresh machine.
package tooltest

import (
	"os"
	"testing"
)

// Missing ends the test tb for want of a tool, with msg, which says what is
// missing and how to install it: it fails the test when the environment
// variable CI is "true" (as CI sets it), and skips it otherwise.
func Missing(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
		return
	}
	tb.Skip(msg)
}
