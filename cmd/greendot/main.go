package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
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
	if err := newApp(stdout, stderr).RunContext(ctx, args); err != nil {
		fmt.Fprintf(stderr, "greendot: %s\n", oneLine(err))
		return 1
	}
	return 0
}

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
		Writer:          stdout,
		ErrWriter:       stderr,
		Suggest:         true,
		HideHelpCommand: true,
		// Errors are printed once, by run; the library must neither print
		// usage on a bad flag nor exit the process.
		OnUsageError:   usageError,
		ExitErrHandler: func(*cli.Context, error) {},
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

// listHelp gives every command under cmds its --help flag before the
// library sorts the commands' flags into categories, so that every
// command's --help lists --help, once, first. The library adds the flag to
// a command only when it runs it: too late for the categories of the
// top-level commands, so their help left it out while that of the graph
// commands showed it.
func listHelp(cmds []*cli.Command) {
	for _, c := range cmds {
		if !slices.Contains(c.Flags, cli.HelpFlag) {
			c.Flags = append(c.Flags, cli.HelpFlag)
		}
		listHelp(c.Subcommands)
	}
}

// usageError returns a flag parsing error as it is, to be printed on one
// line.
func usageError(_ *cli.Context, err error, _ bool) error {
	return fmt.Errorf("%w (see --help)", err)
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
