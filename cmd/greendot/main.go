package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/pkg/version"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
		// A second signal ends the process at once, with the exit code a
		// shell gives a process a signal ended. The process exits itself
		// rather than let the signal's default action do it: a SIGINT that
		// the process started with ignored (a background job of a shell
		// script) would be ignored again.
		sig := <-sigs
		code := 1
		if n, ok := sig.(syscall.Signal); ok {
			code = 128 + int(n)
		}
		os.Exit(code)
	}()
	code := run(ctx, os.Args, os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

// run runs the command line args with the given output streams and returns
// the process's exit code: 0 on success and clean shutdown, 1 with a
// one-line error on stderr otherwise.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if err := newApp(stdout, stderr).RunContext(ctx, args); err != nil && !errors.Is(err, errVersionShown) {
		fmt.Fprintf(stderr, "greendot: %s\n", oneLine(err))
		return 1
	}
	return 0
}

// errVersionShown ends a run that printed the version, with exit code 0.
var errVersionShown = errors.New("version shown")

// newApp builds the command line application. Flags hold parse state, so
// every call builds them afresh.
func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:    "greendot",
		Usage:   "presence (online, away, busy, offline) for apps with many users, over NATS",
		Version: version.String(),
		Description: "Run 'greendot standalone' to try it on one machine: it embeds a NATS server and runs every\n" +
			"process kind in one process. In production, run gateways, reapers and fanouts (and webhooks,\n" +
			"to tell the app's backend) as separate processes against a NATS server or cluster. Every flag\n" +
			"can also be set with an environment variable, shown in brackets.",
		Commands: []*cli.Command{
			standaloneCommand(),
			gatewayCommand(),
			reaperCommand(),
			fanoutCommand(),
			webhooksCommand(),
			graphCommand(),
			bucketsCommand(),
		},
		Flags:     []cli.Flag{helpFlag(), versionFlag()},
		Writer:    stdout,
		ErrWriter: stderr,
		Suggest:   true,
		// The library's own --help and --version are package variables
		// that it writes to as it parses them: apps run at once (the
		// tests run many) would share them. Every app has its own, under
		// the same names, which the library still answers.
		HideHelp:    true,
		HideVersion: true,
		// Errors are printed once, by run; the library must neither print
		// usage on a bad flag nor exit the process.
		OnUsageError:   usageError,
		ExitErrHandler: func(*cli.Context, error) {},
		// Before runs before any command: --version is answered there,
		// as the library answers its own.
		Before: func(c *cli.Context) error {
			if c.Bool("version") {
				cli.ShowVersion(c)
				return errVersionShown
			}
			return nil
		},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return fmt.Errorf("unknown command %q: see 'greendot --help'", c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
	}
	listHelp(app.Commands)
	return app
}

// listHelp gives every command under cmds a --help flag of its own (see
// newApp) before the library sorts the commands' flags into categories,
// so that every command's --help lists --help, once, first.
func listHelp(cmds []*cli.Command) {
	for _, c := range cmds {
		c.HideHelp, c.HideHelpCommand = true, true
		c.Flags = append(c.Flags, helpFlag())
		listHelp(c.Subcommands)
	}
}

// helpFlag and versionFlag return new flags like the library's HelpFlag
// and VersionFlag, by whose names it finds them.
func helpFlag() cli.Flag {
	return &cli.BoolFlag{Name: "help", Aliases: []string{"h"}, Usage: "show help", DisableDefaultText: true}
}

func versionFlag() cli.Flag {
	return &cli.BoolFlag{Name: "version", Aliases: []string{"v"}, Usage: "print the version", DisableDefaultText: true}
}

// usageError returns a flag parsing error, to be printed on one line, with
// the flag named as the docs name it (--conn-ttl) and, for a bad value,
// what the flag wants.
func usageError(c *cli.Context, err error, _ bool) error {
	var flags []cli.Flag
	if c.Command != nil {
		flags = c.Command.Flags
	}
	return fmt.Errorf("%s (see --help)", flagError(flags, err))
}

// The errors of the flag package and of urfave/cli that flagError
// rewrites: they name a flag with one dash, or none, and a bad value with
// "parse error" or the parser's message.
var (
	badFlagValue = regexp.MustCompile(`^invalid (?:boolean )?value ("(?:[^"\\]|\\.)*") for (?:flag )?-([\w-]+): (.*)$`)
	badEnvValue  = regexp.MustCompile(`^could not parse ("(?:[^"\\]|\\.)*") .*from environment variable "(\w+)" for flag ([\w-]+): (.*)$`)
	dashedFlag   = regexp.MustCompile(`^(flag provided but not defined|flag needs an argument): -+([\w-]+)$`)
)

// flagError returns the text of err, a flag parsing error of a command
// with flags, naming the flag with two dashes and saying what a bad value
// should have been.
func flagError(flags []cli.Flag, err error) string {
	msg := err.Error()
	if m := dashedFlag.FindStringSubmatch(msg); m != nil {
		return m[1] + ": --" + m[2]
	}
	if m := badFlagValue.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("--%s %s: %s", m[2], m[1], wantOf(flags, m[2], m[3]))
	}
	if m := badEnvValue.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("%s %s (--%s): %s", m[2], m[1], m[3], wantOf(flags, m[3], m[4]))
	}
	return msg
}

// wantOf says what a value of the flag name wants; reason, the parser's
// word, for a flag it does not know.
func wantOf(flags []cli.Flag, name, reason string) string {
	for _, f := range flags {
		if !slices.Contains(f.Names(), name) {
			continue
		}
		switch f.(type) {
		case *cli.DurationFlag:
			return "want a duration such as 30s, 1m30s or 500ms"
		case *cli.IntFlag, *cli.Int64Flag, *cli.UintFlag, *cli.Uint64Flag:
			return "want a whole number"
		case *cli.Float64Flag:
			return "want a number"
		case *cli.BoolFlag:
			return "want true or false"
		}
	}
	return reason
}

// oneLine joins the lines of an error's text.
func oneLine(err error) string {
	var lines []string
	for l := range strings.Lines(err.Error()) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return "failed"
	}
	return strings.Join(lines, "; ")
}
