package syncbuf_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/greendot/greendot/internal/syncbuf"
)

// TestConcurrentWrites: lines written from many goroutines while String
// is read all end up whole in the buffer (run with -race).
func TestConcurrentWrites(t *testing.T) {
	var b syncbuf.Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				fmt.Fprintf(&b, "w%d-%d\n", i, j)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines, want 800", len(lines))
	}
	seen := map[string]bool{}
	for _, l := range lines {
		seen[l] = true
	}
	if len(seen) != 800 || !seen["w7-99"] {
		t.Errorf("%d distinct lines, want 800 (w7-99 among them)", len(seen))
	}
}
