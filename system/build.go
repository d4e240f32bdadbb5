package system

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Module is the path of greendot's module.
const Module = "github.com/greendot/greendot"

// Greendot is the package of the greendot command, for Build.
const Greendot = "./cmd/greendot"

// Build builds a command of greendot's module, such as Greendot, into the
// file out with the go command on PATH, statically (CGO_ENABLED=0) as the
// Dockerfile does. flags are more flags of go build (-trimpath, -ldflags
// ...). The working directory must be inside greendot's module: when it is
// not, or there is no go command, Build returns an error wrapping
// ErrNoModule.
func Build(ctx context.Context, out, pkg string, flags ...string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("%w: no go command on PATH", ErrNoModule)
	}
	root, err := moduleRoot(ctx, goTool)
	if err != nil {
		return err
	}
	args := append(append([]string{"build"}, flags...), "-o", out, pkg)
	cmd := exec.CommandContext(ctx, goTool, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// moduleRoot returns the directory of greendot's go.mod, when the working
// directory is inside the module.
func moduleRoot(ctx context.Context, goTool string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoModule, err)
	}
	b, err := exec.CommandContext(ctx, goTool, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("%w: go env GOMOD: %v", ErrNoModule, err)
	}
	gomod := strings.TrimSpace(string(b))
	notHere := fmt.Errorf("%w: %s is not inside the module %s", ErrNoModule, wd, Module)
	if gomod == "" || gomod == os.DevNull {
		return "", notHere
	}
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoModule, err)
	}
	for line := range strings.Lines(string(data)) {
		if path, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			if strings.Trim(strings.TrimSpace(path), `"`) != Module {
				return "", notHere
			}
			return filepath.Dir(gomod), nil
		}
	}
	return "", notHere
}
