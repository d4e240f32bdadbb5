package system

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/tooltest"
)

// TestBuild builds the greendot command from inside the module, and
// refuses to from outside it.
func TestBuild(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		tooltest.Missing(t, "no go command on PATH to build greendot with: install Go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "greendot")
	if err := Build(ctx, bin, Greendot, "-trimpath"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "greendot version ") {
		t.Errorf("greendot --version: %v: %s", err, out)
	}

	t.Chdir(t.TempDir())
	err = Build(ctx, filepath.Join(t.TempDir(), "greendot"), Greendot)
	if !errors.Is(err, ErrNoModule) || !strings.Contains(err.Error(), "is not inside the module "+Module) {
		t.Errorf("Build outside the module = %v, want ErrNoModule", err)
	}
}
