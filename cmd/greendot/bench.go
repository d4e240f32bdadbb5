package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/bench"
)

// Flag categories of greendot bench.
const (
	catScenario  = "Scenario"
	catLoad      = "Load generator"
	catBenchSys  = "System under test"
	catBenchTime = "Gateway timings (gateways started by the bench)"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure a greendot system under load: memory per connection, propagation latency, silent death, churn, reconnect storms",
		Description: "greendot bench speaks the client protocol over real WebSockets. It starts its own system (an\n" +
			"embedded NATS server with JetStream, --gateways 'greendot gateway' processes, a reaper and a\n" +
			"fanout) unless --nats-url or --gateway-url name an existing one, and spreads the connections\n" +
			"over worker processes (this binary, at most --conns-per-worker sockets each) dialing from\n" +
			"loopback source addresses 127.0.0.2 and up. Of the --conns connections, --watchers each\n" +
			"follow (mutually, written to the graph first) and watch --follows of the --targets; the rest\n" +
			"are idle. Every connection heartbeats. Scenarios, each bounded in time: idle measures the\n" +
			"gateways' RSS and heap per connection (over their RSS before connecting), CPU per 10k\n" +
			"connections and heartbeat KV writes per second over --duration; propagation has targets\n" +
			"set_status at --rate per second for --duration and measures set_status sent to presence_batch\n" +
			"received; death stops the targets' heartbeats without closing and measures when watchers see\n" +
			"them offline after the TTL; churn replaces connections (new one first, then a clean close) at\n" +
			"--rate per second and counts false offline events; storm restarts gateways and measures the\n" +
			"time until every client is connected again. The report is a markdown table on stdout (median,\n" +
			"min and max over --repeat runs) and JSON with --json; progress goes to stderr.",
		Flags:        concat(benchFlags(), logFlags()),
		OnUsageError: usageError,
		Action:       runBench,
		Subcommands: []*cli.Command{{
			Name:   "worker",
			Usage:  "hold connections for greendot bench (started by it: commands on stdin, replies on stdout)",
			Hidden: true,
			Action: func(c *cli.Context) error {
				return bench.RunWorker(c.Context, os.Stdin, c.App.Writer)
			},
		}},
	}
}

func benchFlags() []cli.Flag {
	auto := func(f *cli.IntFlag, text string) *cli.IntFlag { f.DefaultText = text; return f }
	return []cli.Flag{
		stringFlag(catScenario, "scenario", bench.ScenarioIdle, "what to measure: idle, propagation, death, churn or storm"),
		intFlag(catScenario, "conns", 1000, "live connections in all"),
		auto(intFlag(catScenario, "targets", 0, "connections that are watched, change status (propagation), go silent (death) or are replaced (churn)"),
			"none in idle, else conns/10 up to 1000"),
		auto(intFlag(catScenario, "watchers", 0, "connections that watch targets"), "as many as targets"),
		auto(intFlag(catScenario, "follows", 0, "targets each watcher follows and subscribes to"), "min(10, targets per worker)"),
		durationFlag(catScenario, "duration", 30*time.Second, "measurement window (idle), or how long statuses change (propagation) or connections are replaced (churn)"),
		&cli.Float64Flag{Category: catScenario, Name: "rate", Usage: "status changes per second over all targets (propagation), or connection replacements per second (churn)",
			DefaultText: "one per target per second up to 1000 (propagation), 1000 (churn)", EnvVars: []string{envVar("rate")}},
		durationFlag(catScenario, "jitter", 5*time.Second, "storm: longest random wait before a closed client first dials again; failed dials then back off as the browser client does (full jitter, 0.5s doubling up to 30s)"),
		stringFlag(catScenario, "storm-signal", "term", "storm: how gateways are stopped before they start again: term (drain) or kill"),
		auto(intFlag(catScenario, "storm-gateways", 0, "storm: how many gateways restart at once"), "all"),
		intFlag(catScenario, "repeat", 1, "runs of the scenario, each on a fresh system; the table gives median, min and max"),

		auto(intFlag(catLoad, "workers", 0, "worker processes holding the connections"), "conns / conns-per-worker, rounded up"),
		intFlag(catLoad, "conns-per-worker", bench.DefaultConnsPerWorker, "most connections one worker process holds (a process may open 20,000 files here)"),
		auto(intFlag(catLoad, "source-addrs", 0, "loopback source addresses to dial from (127.0.0.2 and up), so the ephemeral port range is not the limit"),
			"one per 20,000 connections"),
		&cli.Float64Flag{Category: catLoad, Name: "connect-rate", Usage: "most new connections per second while connecting, over all workers; 0 for no limit",
			DefaultText: "0 (no limit)", EnvVars: []string{envVar("connect-rate")}},
		intFlag(catLoad, "connect-concurrency", 64, "dials in progress at once per worker"),
		durationFlag(catLoad, "dial-timeout", 30*time.Second, "time one dial, upgrade and hello may take"),

		stringFlag(catBenchSys, "nats-url", "", "NATS server to use instead of starting an embedded one (it needs JetStream)"),
		&cli.StringSliceFlag{Category: catBenchSys, Name: "gateway-url", Usage: "gateways to use instead of starting them (ws://host:port/ws or host:port; repeat or comma-separate); storm needs its own",
			EnvVars: []string{envVar("gateway-url")}},
		auto(intFlag(catBenchSys, "gateways", 0, "gateway processes to start"), "conns / conns-per-gateway, rounded up"),
		intFlag(catBenchSys, "conns-per-gateway", bench.DefaultConnsPerGateway, "most connections per gateway process, when --gateways is not set"),
		&cli.StringSliceFlag{Category: catBenchSys, Name: "gateway-arg", Usage: "another flag for the gateways started (--gateway-arg=--read-workers=64; repeat for more)",
			EnvVars: []string{envVar("gateway-arg")}},

		&cli.DurationFlag{Category: catBenchTime, Name: "conn-ttl", Usage: "the gateways' --conn-ttl", DefaultText: "the gateway's default", EnvVars: []string{envVar("conn-ttl")}},
		&cli.DurationFlag{Category: catBenchTime, Name: "heartbeat-interval", Usage: "the gateways' --heartbeat-interval", DefaultText: "the gateway's default", EnvVars: []string{envVar("heartbeat-interval")}},
		&cli.DurationFlag{Category: catBenchTime, Name: "batch-interval", Usage: "the gateways' --batch-interval", DefaultText: "the gateway's default", EnvVars: []string{envVar("batch-interval")}},
		&cli.DurationFlag{Category: catBenchTime, Name: "offline-grace", Usage: "the gateways' --offline-grace", DefaultText: "the gateway's default", EnvVars: []string{envVar("offline-grace")}},

		stringFlag(catOutput, "json", "", "file to write the report to as JSON (written also when a run fails part way)"),
	}
}

func runBench(c *cli.Context) error {
	if c.Args().Present() {
		return fmt.Errorf("unexpected argument %s: greendot bench takes only flags", quote(c.Args().First()))
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	cfg := bench.Config{
		Scenario:           c.String("scenario"),
		Conns:              c.Int("conns"),
		Targets:            c.Int("targets"),
		Watchers:           c.Int("watchers"),
		Follows:            c.Int("follows"),
		Duration:           c.Duration("duration"),
		Rate:               c.Float64("rate"),
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
		NATSURL:            c.String("nats-url"),
		GatewayURLs:        c.StringSlice("gateway-url"),
		Gateways:           c.Int("gateways"),
		ConnsPerGateway:    c.Int("conns-per-gateway"),
		GatewayArgs:        c.StringSlice("gateway-arg"),
		ConnTTL:            c.Duration("conn-ttl"),
		HeartbeatInterval:  c.Duration("heartbeat-interval"),
		BatchInterval:      c.Duration("batch-interval"),
		OfflineGrace:       c.Duration("offline-grace"),
		Logger:             log,
	}
	for _, name := range []string{"conns", "targets", "watchers", "follows", "repeat", "workers", "conns-per-worker",
		"source-addrs", "connect-concurrency", "gateways", "conns-per-gateway", "storm-gateways"} {
		if c.Int(name) < 0 {
			return fmt.Errorf("--%s %d: want 0 or more", name, c.Int(name))
		}
	}
	if err := notNegative(c, "duration", "jitter", "dial-timeout", "conn-ttl", "heartbeat-interval", "batch-interval", "offline-grace"); err != nil {
		return err
	}
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
