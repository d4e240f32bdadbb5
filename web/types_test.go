package web_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/tooltest"
)

// TestDeclarationsTypeCheck compiles the TypeScript in testdata/types (the
// examples of README.md, the rest of the module's exports, and the ws
// package's WebSocket passed as the constructor) against greendot.d.ts,
// with TypeScript's strict checks: what the docs show an app writing
// compiles. Without Node.js or the folder's packages it fails in CI
// (CI=true) and is skipped elsewhere, with a line that says what to
// install.
func TestDeclarationsTypeCheck(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "types")
	tsc := filepath.Join(dir, "node_modules", "typescript", "bin", "tsc")
	missing := func(why string) {
		t.Helper()
		tooltest.Missing(t, "no type check of greendot.d.ts: "+why+": install Node.js (apt-get install -y nodejs npm) "+
			"and the packages of web/testdata/types (npm ci --prefix web/testdata/types)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH")
	}
	if _, err := os.Stat(tsc); err != nil {
		missing(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, tsc, "--pretty", "false", "-p", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("tsc -p %s: %v\n%s", dir, err, out)
	}
}
