package tooltest_test

import (
	"fmt"
	"slices"
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
			t.Setenv("CI", tt.ci)
			r := &recorder{TB: t}
			tooltest.Missing(r, msg)
			if want := []string{tt.want}; !slices.Equal(r.calls, want) {
				t.Errorf("calls %q, want %q", r.calls, want)
			}
		})
	}
}
