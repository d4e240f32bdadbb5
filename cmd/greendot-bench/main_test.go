package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/cmd/greendot-bench/internal/bench"
)

// parse runs the command's flags on args (without the program name) and
// returns the configuration they make.
func parse(t *testing.T, args ...string) (bench.Config, error) {
	t.Helper()
	var cfg bench.Config
	var cfgErr error
	app := &cli.App{
		Flags:  flags(),
		Writer: io.Discard, ErrWriter: io.Discard,
		Action: func(c *cli.Context) error {
			cfg, cfgErr = config(c)
			return nil
		},
	}
	if err := app.Run(append([]string{"greendot-bench"}, args...)); err != nil {
		return cfg, err
	}
	return cfg, cfgErr
}

// TestEnvironment configures the bench with its own variables only: a
// greendot process's variable, such as GREENDOT_NATS_URL set for a
// gateway, never makes the bench use an existing system.
func TestEnvironment(t *testing.T) {
	t.Setenv("GREENDOT_NATS_URL", "nats://10.0.0.1:4222")
	t.Setenv("GREENDOT_CONNS", "5")
	t.Setenv("GREENDOT_BENCH_CONNS", "7")
	t.Setenv("GREENDOT_BENCH_GREENDOT", "/opt/greendot")
	cfg, err := parse(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATSURL != "" || cfg.Conns != 7 || cfg.Greendot != "/opt/greendot" {
		t.Errorf("nats url %q, conns %d, greendot %q; want none, 7 and /opt/greendot", cfg.NATSURL, cfg.Conns, cfg.Greendot)
	}

	t.Setenv("GREENDOT_BENCH_NATS_URL", "nats://127.0.0.1:4222")
	if cfg, err := parse(t); err != nil || cfg.NATSURL != "nats://127.0.0.1:4222" {
		t.Errorf("with GREENDOT_BENCH_NATS_URL: nats url %q, %v", cfg.NATSURL, err)
	}
	if cfg, err := parse(t, "--nats-url", "nats://127.0.0.2:4222"); err != nil || cfg.NATSURL != "nats://127.0.0.2:4222" {
		t.Errorf("with --nats-url: nats url %q, %v", cfg.NATSURL, err)
	}
}

// TestEveryFlagHasABenchVariable checks that every flag has one variable,
// GREENDOT_BENCH_ and its name.
func TestEveryFlagHasABenchVariable(t *testing.T) {
	for _, f := range flags() {
		name := f.Names()[0]
		want := "GREENDOT_BENCH_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		if got := f.(cli.DocGenerationFlag).GetEnvVars(); len(got) != 1 || got[0] != want {
			t.Errorf("--%s has variables %q, want %s", name, got, want)
		}
	}
}

// TestCommandLine runs the command's application as main does.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		err      string // in the error, or none
		stdout   string
		noStdout string
	}{
		{name: "help", args: []string{"--help"}, stdout: "--greendot value", noStdout: "COMMANDS:"},
		{name: "help names the variables", args: []string{"--help"}, stdout: "[$GREENDOT_BENCH_SCENARIO]"},
		{name: "argument", args: []string{"idle"}, err: `unexpected argument "idle": greendot-bench takes only flags`},
		{name: "negative", args: []string{"--conns", "-1"}, err: "--conns -1: want 0 or more"},
		{name: "log level", args: []string{"--log-level", "loud"}, err: `--log-level "loud": want debug, info, warn or error`},
		{name: "unknown flag", args: []string{"--nats"}, err: "flag provided but not defined: -nats (see --help)"},
		{name: "bad scenario", args: []string{"--scenario", "calm", "--greendot", "/bin/true"}, err: `scenario "calm": want idle`},
		{name: "bad gateway env", args: []string{"--gateway-env", "GOMAXPROCS", "--greendot", "/bin/true"}, err: `gateway environment variable "GOMAXPROCS": want NAME=VALUE`},
		{name: "bad gateway env name", args: []string{"--gateway-env", "1X=2", "--greendot", "/bin/true"}, err: `gateway environment variable "1X=2": want NAME=VALUE`},
		{name: "gateway env for gateways not started", args: []string{"--gateway-env", "GOMAXPROCS=1", "--gateway-url", "127.0.0.1:1", "--greendot", "/bin/true"}, err: "--gateway-env is for the gateways the bench starts"},
		// Outside greendot's module, without --greendot, the binary its
		// gateways run cannot be built.
		{name: "no greendot", args: []string{"--conns", "10"}, err: "no greendot binary given (--greendot), and cannot build greendot: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Chdir(t.TempDir())
			var stdout bytes.Buffer
			err := newApp(&stdout, io.Discard).RunContext(context.Background(), append([]string{"greendot-bench"}, tt.args...))
			switch {
			case tt.err == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Errorf("error %v, want %q in it", err, tt.err)
			}
			if !strings.Contains(stdout.String(), tt.stdout) {
				t.Errorf("stdout %q, want %q in it", stdout.String(), tt.stdout)
			}
			if tt.noStdout != "" && strings.Contains(stdout.String(), tt.noStdout) {
				t.Errorf("stdout names %q:\n%s", tt.noStdout, stdout.String())
			}
		})
	}
}
