// Command greendot-bench is greendot's load generator. It measures a
// greendot system under load (memory per connection, propagation latency,
// silent death, churn, reconnect storms) by speaking the client protocol
// over real WebSockets; docs/BENCHMARKS.md lists its flags and what it
// measured.
//
// It is a command of its own, apart from the greendot binary, so that the
// product carries neither the generator nor its dependencies. Its flags'
// environment variables start with GREENDOT_BENCH_, so that no variable
// means one thing to greendot and another to the bench.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/cmd/greendot-bench/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one ends the process at once.
	context.AfterFunc(ctx, stop)
	err := newApp(os.Stdout, os.Stderr).RunContext(ctx, os.Args)
	stop()
	if err != nil {
		// One line, whatever the error: 0 on success, 1 otherwise.
		fmt.Fprintf(os.Stderr, "greendot-bench: %s\n", strings.Join(strings.Fields(err.Error()), " "))
		os.Exit(1)
	}
}

// envPrefix starts the environment variable of every flag.
const envPrefix = "GREENDOT_BENCH_"

// env returns the environment variable of a flag, as EnvVars takes it:
// GREENDOT_BENCH_ and the flag's name in upper snake case.
func env(name string) []string {
	return []string{envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
}

// Flag categories, as --help groups them.
const (
	catScenario = "Scenario"
	catLoad     = "Load generator"
	catSystem   = "System under test"
	catTimings  = "Gateway timings (gateways started by the bench)"
	catOutput   = "Output"
	catLog      = "Logging"
)

// newApp builds the command line application. Flags hold parse state, so
// every call builds them afresh.
func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:  "greendot-bench",
		Usage: "measure a greendot system under load: memory per connection, propagation latency, silent death, churn, reconnect storms, rooms",
		Description: "greendot-bench speaks the client protocol over real WebSockets. It starts its own system (an\n" +
			"embedded NATS server with JetStream, --gateways 'greendot gateway' processes, a reaper and a\n" +
			"fanout, all from the --greendot binary) unless --nats-url or --gateway-url name an existing one,\n" +
			"and spreads the connections over worker processes ('greendot-bench worker', at most\n" +
			"--conns-per-worker sockets each) dialing from loopback source addresses 127.0.0.2 and up. The\n" +
			"processes it starts get no GREENDOT_ variables from its environment: its flags alone configure\n" +
			"them. Of the --conns connections, --watchers each follow (mutually, written to the graph first)\n" +
			"and watch --follows of the --targets; the rest are idle. Every connection heartbeats.\n" +
			"Scenarios, each bounded in time: idle measures the gateways' RSS and heap per connection (over\n" +
			"their RSS before connecting), the workers' RSS and the kernel's slab per connection, CPU per\n" +
			"10k connections, and the JetStream writes and stored messages per second over --duration;\n" +
			"propagation has targets set_status at --rate per second for --duration and measures set_status\n" +
			"sent to presence_batch received, in all and clear of the spans in which the workers' speed\n" +
			"probe (a fixed piece of arithmetic every 10ms, timed in its thread's CPU time) found the\n" +
			"processors at under half their usual speed; death stops the targets' heartbeats without closing\n" +
			"and measures when watchers see them offline after the TTL; churn replaces connections (new one\n" +
			"first, then a clean close) at --rate per second and counts false offline events; storm restarts\n" +
			"gateways and measures the time until every client is connected again; room puts every\n" +
			"connection in one room, then has its first 100 members by user id leave and join again at\n" +
			"--rate per second for --duration, and measures join to room_state and each change to the other\n" +
			"members' room_diff; typing puts the connections in rooms of --room-size, has one member of each\n" +
			"room send a typing signal every --typing-interval for --duration, and measures it to the other\n" +
			"members' room_signal (in all and clear of the slow spans, as propagation), the CPU per 10k\n" +
			"rooms and the gateways' memory per room membership; hostile pairs the connections (each\n" +
			"watcher follows one target), has the targets set_status at --rate per second (20 by default)\n" +
			"through a baseline phase and one phase per attack on the first gateway, each --duration long\n" +
			"(floods of pongs, of pongs inside an unfinished message, of empty continuations, 1 MiB JSON\n" +
			"bombs, slowloris, idle TCP connections, request smuggling, malformed upgrades, messages over\n" +
			"the rate limit, from raw sockets on 127.0.p.n), and measures the watchers' latency and losses,\n" +
			"the gateway's answers and its CPU in each.\n" +
			"The report is a markdown table on stdout (median, min and max over --repeat runs) and JSON\n" +
			"with --json; progress goes to stderr.",
		Flags:           flags(),
		Action:          runBench,
		Writer:          stdout,
		ErrWriter:       stderr,
		HideHelpCommand: true,
		// Errors are printed once, by run; the library must neither print
		// usage on a bad flag nor exit the process.
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return fmt.Errorf("%w (see --help)", err)
		},
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{{
			Name:   "worker",
			Usage:  "hold connections for greendot-bench (started by it: commands on stdin, replies on stdout)",
			Hidden: true,
			Action: func(c *cli.Context) error {
				return bench.RunWorker(c.Context, os.Stdin, c.App.Writer)
			},
		}},
	}
}

// flags are the command's flags.
func flags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Category: catScenario, Name: "scenario", Value: bench.ScenarioIdle, EnvVars: env("scenario"),
			Usage: "what to measure: idle, propagation, death, churn, storm, room, typing or hostile"},
		&cli.IntFlag{Category: catScenario, Name: "conns", Value: 1000, EnvVars: env("conns"),
			Usage: "live connections in all"},
		&cli.IntFlag{Category: catScenario, Name: "targets", EnvVars: env("targets"), DefaultText: "none in idle, conns/2 in hostile (pairs), else conns/10 up to 1000",
			Usage: "connections that are watched, change status (propagation), go silent (death) or are replaced (churn)"},
		&cli.IntFlag{Category: catScenario, Name: "watchers", EnvVars: env("watchers"), DefaultText: "as many as targets",
			Usage: "connections that watch targets"},
		&cli.IntFlag{Category: catScenario, Name: "follows", EnvVars: env("follows"), DefaultText: "1 in hostile, else min(10, targets per worker)",
			Usage: "targets each watcher follows and subscribes to"},
		&cli.DurationFlag{Category: catScenario, Name: "duration", Value: 30 * time.Second, EnvVars: env("duration"),
			Usage: "measurement window (idle), or how long statuses change (propagation), connections are replaced (churn), members leave and join (room), rooms get typing signals (typing) or each phase lasts (hostile)"},
		&cli.Float64Flag{Category: catScenario, Name: "rate", EnvVars: env("rate"), DefaultText: "one per target per second up to 1000 (propagation), 1000 (churn), 100 (room), 20 (hostile)",
			Usage: "status changes per second over all targets (propagation, hostile), connection replacements per second (churn), or leaves and joins per second (room)"},
		&cli.IntFlag{Category: catScenario, Name: "room-size", Value: 10, EnvVars: env("room-size"),
			Usage: "typing: members of each room (the connections beyond the last full room join none)"},
		&cli.DurationFlag{Category: catScenario, Name: "typing-interval", Value: 2 * time.Second, EnvVars: env("typing-interval"),
			Usage: "typing: how often each room gets a typing signal (from its members in turn)"},
		&cli.DurationFlag{Category: catScenario, Name: "jitter", Value: 5 * time.Second, EnvVars: env("jitter"),
			Usage: "storm: longest random wait before a closed client first dials again; failed dials then back off as the browser client does (full jitter, 0.5s doubling up to 30s)"},
		&cli.StringFlag{Category: catScenario, Name: "storm-signal", Value: "term", EnvVars: env("storm-signal"),
			Usage: "storm: how gateways are stopped before they start again: term (drain) or kill"},
		&cli.IntFlag{Category: catScenario, Name: "storm-gateways", EnvVars: env("storm-gateways"), DefaultText: "all",
			Usage: "storm: how many gateways restart at once"},
		&cli.IntFlag{Category: catScenario, Name: "repeat", Value: 1, EnvVars: env("repeat"),
			Usage: "runs of the scenario, each on a fresh system; the table gives median, min and max"},

		&cli.IntFlag{Category: catLoad, Name: "workers", EnvVars: env("workers"), DefaultText: "conns / conns-per-worker, rounded up",
			Usage: "worker processes holding the connections"},
		&cli.IntFlag{Category: catLoad, Name: "conns-per-worker", Value: bench.DefaultConnsPerWorker, EnvVars: env("conns-per-worker"),
			Usage: "most connections one worker process holds (a process may open 20,000 files here)"},
		&cli.IntFlag{Category: catLoad, Name: "source-addrs", EnvVars: env("source-addrs"), DefaultText: "one per 20,000 connections",
			Usage: "loopback source addresses to dial from (127.0.0.2 and up), so the ephemeral port range is not the limit"},
		&cli.Float64Flag{Category: catLoad, Name: "connect-rate", EnvVars: env("connect-rate"), DefaultText: "0 (no limit)",
			Usage: "most new connections per second while connecting, over all workers; 0 for no limit"},
		&cli.IntFlag{Category: catLoad, Name: "connect-concurrency", Value: 64, EnvVars: env("connect-concurrency"),
			Usage: "dials in progress at once per worker"},
		&cli.BoolFlag{Category: catLoad, Name: "ws-compression", EnvVars: env("ws-compression"),
			Usage: "connections offer permessage-deflate, which the gateways accept unless started with --gateway-arg=--ws-compression=false"},
		&cli.DurationFlag{Category: catLoad, Name: "dial-timeout", Value: 30 * time.Second, EnvVars: env("dial-timeout"),
			Usage: "time one dial, upgrade and hello may take"},

		&cli.StringFlag{Category: catSystem, Name: "greendot", EnvVars: env("greendot"), DefaultText: "built from ./cmd/greendot",
			Usage: "the greendot binary to start gateways, the reaper and the fanout from; without it, the bench builds ./cmd/greendot into its work directory, which needs the go command and a working directory inside greendot's module"},
		&cli.StringFlag{Category: catSystem, Name: "nats-url", EnvVars: env("nats-url"),
			Usage: "NATS server to use instead of starting an embedded one (it needs JetStream)"},
		&cli.StringSliceFlag{Category: catSystem, Name: "gateway-url", EnvVars: env("gateway-url"),
			Usage: "gateways to use instead of starting them (ws://host:port/ws or host:port; repeat or comma-separate); storm needs its own"},
		&cli.IntFlag{Category: catSystem, Name: "gateways", EnvVars: env("gateways"), DefaultText: "conns / conns-per-gateway, rounded up",
			Usage: "gateway processes to start"},
		&cli.IntFlag{Category: catSystem, Name: "conns-per-gateway", Value: bench.DefaultConnsPerGateway, EnvVars: env("conns-per-gateway"),
			Usage: "most connections per gateway process, when --gateways is not set"},
		&cli.StringSliceFlag{Category: catSystem, Name: "gateway-arg", EnvVars: env("gateway-arg"),
			Usage: "another flag for the gateways started (--gateway-arg=--read-workers=64; repeat for more)"},
		&cli.StringSliceFlag{Category: catSystem, Name: "gateway-env", EnvVars: env("gateway-env"),
			Usage: "a NAME=VALUE variable for the environment of the gateways started (--gateway-env=GOMAXPROCS=1; repeat for more)"},

		&cli.DurationFlag{Category: catTimings, Name: "conn-ttl", EnvVars: env("conn-ttl"), DefaultText: "the gateway's default",
			Usage: "the gateways' --conn-ttl"},
		&cli.DurationFlag{Category: catTimings, Name: "heartbeat-interval", EnvVars: env("heartbeat-interval"), DefaultText: "the gateway's default",
			Usage: "the gateways' --heartbeat-interval"},
		&cli.DurationFlag{Category: catTimings, Name: "batch-interval", EnvVars: env("batch-interval"), DefaultText: "the gateway's default",
			Usage: "the gateways' --batch-interval"},
		&cli.DurationFlag{Category: catTimings, Name: "offline-grace", EnvVars: env("offline-grace"), DefaultText: "the gateway's default",
			Usage: "the gateways' --offline-grace"},

		&cli.StringFlag{Category: catOutput, Name: "json", EnvVars: env("json"),
			Usage: "file to write the report to as JSON (written also when a run fails part way)"},
		&cli.StringFlag{Category: catLog, Name: "log-level", Value: "info", EnvVars: env("log-level"),
			Usage: "least level of progress logged: debug, info, warn or error"},
		&cli.StringFlag{Category: catLog, Name: "log-format", Value: "text", EnvVars: env("log-format"),
			Usage: "progress line format: text (logfmt) or json"},
	}
}

// newLogger builds the progress log from --log-level and --log-format,
// writing to the app's error stream.
func newLogger(c *cli.Context) (*slog.Logger, error) {
	var opts slog.HandlerOptions
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.String("log-level"))
	}
	opts.Level = level
	if f := c.String("log-format"); f == "json" {
		return slog.New(slog.NewJSONHandler(c.App.ErrWriter, &opts)), nil
	} else if f != "text" {
		return nil, fmt.Errorf("--log-format %q: want text or json", f)
	}
	return slog.New(slog.NewTextHandler(c.App.ErrWriter, &opts)), nil
}

// config reads the flags into a bench configuration.
func config(c *cli.Context) (bench.Config, error) {
	for _, name := range []string{"conns", "targets", "watchers", "follows", "repeat", "workers", "conns-per-worker",
		"source-addrs", "connect-concurrency", "gateways", "conns-per-gateway", "storm-gateways"} {
		if c.Int(name) < 0 {
			return bench.Config{}, fmt.Errorf("--%s %d: want 0 or more", name, c.Int(name))
		}
	}
	for _, name := range []string{"duration", "jitter", "typing-interval", "dial-timeout", "conn-ttl", "heartbeat-interval", "batch-interval", "offline-grace"} {
		if d := c.Duration(name); d < 0 {
			return bench.Config{}, fmt.Errorf("--%s %v: want 0 or a positive duration", name, d)
		}
	}
	return bench.Config{
		Scenario:           c.String("scenario"),
		Conns:              c.Int("conns"),
		Targets:            c.Int("targets"),
		Watchers:           c.Int("watchers"),
		Follows:            c.Int("follows"),
		Duration:           c.Duration("duration"),
		Rate:               c.Float64("rate"),
		RoomSize:           c.Int("room-size"),
		TypingInterval:     c.Duration("typing-interval"),
		Jitter:             c.Duration("jitter"),
		StormSignal:        c.String("storm-signal"),
		StormGateways:      c.Int("storm-gateways"),
		Repeat:             c.Int("repeat"),
		Workers:            c.Int("workers"),
		ConnsPerWorker:     c.Int("conns-per-worker"),
		Sources:            c.Int("source-addrs"),
		ConnectRate:        c.Float64("connect-rate"),
		ConnectConcurrency: c.Int("connect-concurrency"),
		DialTimeout:        c.Duration("dial-timeout"),
		WSCompression:      c.Bool("ws-compression"),
		Greendot:           c.String("greendot"),
		NATSURL:            c.String("nats-url"),
		GatewayURLs:        c.StringSlice("gateway-url"),
		Gateways:           c.Int("gateways"),
		ConnsPerGateway:    c.Int("conns-per-gateway"),
		GatewayArgs:        c.StringSlice("gateway-arg"),
		GatewayEnv:         c.StringSlice("gateway-env"),
		ConnTTL:            c.Duration("conn-ttl"),
		HeartbeatInterval:  c.Duration("heartbeat-interval"),
		BatchInterval:      c.Duration("batch-interval"),
		OfflineGrace:       c.Duration("offline-grace"),
	}, nil
}

func runBench(c *cli.Context) error {
	if c.Args().Present() {
		return fmt.Errorf("unexpected argument %q: greendot-bench takes only flags", c.Args().First())
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	cfg, err := config(c)
	if err != nil {
		return err
	}
	cfg.Logger = log
	rep, runErr := bench.Run(c.Context, cfg)
	if rep != nil {
		rep.Args = os.Args
		if err := rep.WriteMarkdown(c.App.Writer); err != nil {
			return err
		}
		if path := c.String("json"); path != "" {
			data, err := json.MarshalIndent(rep, "", "  ")
			if err != nil {
				return err
			}
			if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
				return fmt.Errorf("--json: %w", err)
			}
		}
	}
	return runErr
}
