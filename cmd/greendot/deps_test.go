package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/greendot/greendot/internal/tooltest"
)

// TestProductDependencies checks with go list that the greendot binary
// links neither the load generator (cmd/greendot-bench, over
// internal/bench) nor the histogram library only it uses.
func TestProductDependencies(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		tooltest.Missing(t, "no go command on PATH to list the dependencies with: install Go")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/greendot/greendot/gateway") {
		t.Fatalf("go list -deps does not list the gateway: %q", deps)
	}
	for _, d := range deps {
		if strings.Contains(d, "/bench") || strings.Contains(strings.ToLower(d), "hdrhistogram") {
			t.Errorf("greendot depends on %s", d)
		}
	}
}
