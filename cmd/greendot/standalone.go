package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/system"
	"github.com/greendot/greendot/web"
	"github.com/greendot/greendot/webhook"
)

// startTimeout bounds the start of the embedded NATS server and the
// opening of the buckets in it: steps that end at once unless something is
// broken. The wait for the parts to be ready has no bound (see awaitParts).
const startTimeout = 30 * time.Second

// waitLogEvery is how often standalone mode, while it waits for its parts
// to be ready, logs the first that is not and why. Tests shorten it.
var waitLogEvery = 10 * time.Second

// stopTimeout bounds the wait for each part to stop on shutdown, beyond
// the gateway's --drain-period, which its stop takes on top.
var stopTimeout = system.DefaultStopTimeout

func standaloneCommand() *cli.Command {
	return &cli.Command{
		Name:  "standalone",
		Usage: "run everything in one process: an embedded NATS server with JetStream, a gateway, a reaper and a fanout (and webhooks, with --webhook-url)",
		Description: "The NATS server stores its data under --data and also listens on --nats-listen, so the nats CLI\n" +
			"can inspect the state (nats --server nats://127.0.0.1:4222 kv ls). With dev auth off it takes only\n" +
			"the NKey whose seed it keeps in --data/" + natsKeyFile + " (made the first time, readable by its owner only):\n" +
			"give it to the nats CLI with --nkey, to the greendot commands with --nats-nkey. With dev auth on it\n" +
			"takes any client, as the log says. The gateway, reaper and fanout\n" +
			"each use their own connection to it. Dev auth (?user=<id>) is on while --listen is a loopback\n" +
			"address, and then the demo page is served at / (its endpoints write the graph for any ?user=).\n" +
			"The browser client is at /greendot.js. With --webhook-url, a webhooks process POSTs every\n" +
			"presence transition to the app's backend, read from the stream presence_feed, created then\n" +
			"(kept 72h). GET /readyz on --listen answers 200 once every part is ready (the NATS server with\n" +
			"JetStream, the reaper, the fanout, the webhooks process, the gateway), when the line saying where\n" +
			"to connect is printed, and 503 naming the first that is not (\"part\") otherwise. Until then it\n" +
			"logs every 10s the part it waits for and why, and waits as long as that takes (the reaper's sweep\n" +
			"at start reads the whole store), unless a part fails or it is stopped. On SIGINT or SIGTERM the\n" +
			"gateway drains, its listener closed first, then the reaper, fanout and webhooks process stop,\n" +
			"then the NATS server.",
		Flags: concat(
			[]cli.Flag{
				stringFlag(catEmbedded, "data", "./greendot-data", "directory of the embedded NATS server's JetStream storage"),
				stringFlag(catEmbedded, "nats-listen", "127.0.0.1:4222", "client address of the embedded NATS server (port 0 picks a free port); empty for in-process connections only"),
				sweepFlag(),
			},
			gatewayFlags(true),
			webhookFlags("webhook-", catWebhooks),
			logFlags(),
		),
		OnUsageError: usageError,
		Action:       runStandalone,
	}
}

func runStandalone(c *cli.Context) error {
	if c.Args().Present() {
		return fmt.Errorf("unexpected argument %s: greendot standalone takes only flags", quote(c.Args().First()))
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	gcfg, err := gatewayConfig(c, log, presence.BucketOptions{})
	if err != nil {
		return err
	}
	if err := gatewayAuth(c, &gcfg, log, true); err != nil {
		return err
	}
	if err := notNegative(c, "sweep-interval"); err != nil {
		return err
	}
	rcfg := reaper.Config{Logger: log, SweepInterval: c.Duration("sweep-interval")}
	if err := rcfg.Validate(); err != nil {
		return err
	}
	fcfg := fanout.Config{Logger: log}
	wcfg, err := standaloneWebhooks(c, log)
	if err != nil {
		return err
	}
	natsListen := c.String("nats-listen")
	ncfg := system.NATSConfig{Name: "greendot", InProcessOnly: natsListen == "", Logger: log}
	if natsListen != "" {
		loopback, err := isLoopback(natsListen)
		if err != nil {
			return fmt.Errorf("--nats-listen %s: %w", quote(natsListen), err)
		}
		if !loopback && gcfg.DevAuth {
			log.Warn("the embedded NATS server listens on an address that is not loopback, with no authentication: anyone who reaches it can read and change all presence state",
				"addr", natsListen)
		}
		if ncfg.Host, ncfg.Port, err = natsAddress(natsListen); err != nil {
			return err
		}
	}
	// The browser client is served at /greendot.js and, while dev auth is
	// on and only this machine can connect, the demo at /.
	loopback, err := isLoopback(c.String("listen"))
	if err != nil {
		return err
	}
	demo := gcfg.DevAuth && loopback

	ln, err := listenGateway(c.String("listen"))
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	unlock, err := lockData(c.String("data"), &ncfg)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer unlock()
	ncfg.StartTimeout = startTimeout
	sopts := system.Options{Name: "greendot standalone", NATS: &ncfg, InProcess: true, Logger: log,
		StopTimeout: stopTimeout + gcfg.DrainPeriod}
	// Out of dev mode, a NATS server that listens takes only the NKey
	// kept in the data directory: its own processes use it, and so may
	// the operator's tools. In dev mode it takes anyone, as the gateway
	// does.
	var key string
	if natsListen != "" && !gcfg.DevAuth {
		var public string
		if key, public, err = natsKey(ncfg.StoreDir); err != nil {
			_ = ln.Close()
			return err
		}
		ncfg.Options = &server.Options{Nkeys: []*server.NkeyUser{{Nkey: public}}}
		opt, err := nats.NkeyOptionFromSeed(key)
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("--data: NATS key: %w", err)
		}
		sopts.NATSOptions = []nats.Option{opt}
	}
	sys, err := system.Start(sopts)
	if err != nil {
		_ = ln.Close()
		if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "listen" {
			return fmt.Errorf("--nats-listen %s: %w", natsListen, op)
		}
		return err
	}
	attrs := []any{"store_dir", ncfg.StoreDir}
	if natsListen != "" {
		attrs = append(attrs, "url", "nats://"+dialHost(sys.NATS().Addr()))
	}
	log.Info("nats server ready", attrs...)
	switch {
	case key != "":
		log.Info("the embedded NATS server takes only the NKey in the data directory (nats --nkey, greendot --nats-nkey)", "nkey", key)
	case natsListen != "":
		log.Warn("the embedded NATS server takes any client, with no authentication, while dev auth is on: whatever runs on this machine can change presence state and the graph")
	}

	serveErr := serveStandalone(c, sys, ln, gcfg, rcfg, fcfg, wcfg, demo, key)
	// The gateway stops first, so that what its closing sockets wrote is
	// still processed by the reaper and fanout; then they stop, then NATS.
	stopErr := sys.Stop()
	log.Info("nats server stopped")
	return errors.Join(serveErr, stopErr)
}

// serveStandalone runs the reaper, the fanout, the webhooks process (when
// wcfg is not nil) and the gateway on sys,
// serving ln (which it owns), prints the ready line once every part is
// ready (GET /readyz answers 200), and returns when the command's context
// is canceled or a part has stopped. The caller stops sys, whose Stop
// returns the parts' errors.
func serveStandalone(c *cli.Context, sys *system.System, ln net.Listener, gcfg gateway.Config, rcfg reaper.Config, fcfg fanout.Config, wcfg *webhook.Config, demo bool, natsKey string) error {
	// The buckets exist before the services start, so that none of them
	// creates a bucket while another creates its consumer on it. The demo
	// writes the graph through this store. The webhooks read presence_feed,
	// created with the buckets.
	store, err := openBuckets(c.Context, sys, wcfg != nil)
	if err != nil {
		_ = ln.Close()
		if c.Context.Err() != nil {
			return nil // stopped while starting: not a failure
		}
		return err
	}
	if _, err := sys.StartReaper("reaper", rcfg); err != nil {
		_ = ln.Close()
		return err
	}
	if _, err := sys.StartFanout("fanout", fcfg); err != nil {
		_ = ln.Close()
		return err
	}
	if wcfg != nil {
		if _, err := sys.StartWebhooks("webhooks", *wcfg); err != nil {
			_ = ln.Close()
			return err
		}
	}
	webOpts := web.Options{Demo: demo, Logger: gcfg.Logger}
	if demo {
		webOpts.Store = store
	}
	gcfg.Static = web.Handler(webOpts)
	// GET /metrics serves the metrics of the services, which share this
	// process, and GET /readyz says whether every part is ready: the NATS
	// server, then the services in the order they started, naming the
	// first that is not.
	gcfg.Metrics = sys.Gatherer()
	gcfg.Readyz = sys.Ready
	addr := ln.Addr()
	if _, err := sys.StartGateway("gateway", gcfg, ln); err != nil {
		return err
	}

	// A part that stops on its own (a failure) ends the command.
	ctx, cancel := context.WithCancel(c.Context)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-sys.Exited():
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() {
		cancel()
		<-watched
	}()
	switch err := awaitParts(ctx, gcfg.Logger, sys); {
	case err == nil:
		fmt.Fprintln(c.App.Writer, readyLine(addr, gcfg, demo, sys, natsKey, c.String("data")))
	case ctx.Err() != nil || errors.Is(err, system.ErrStopped):
		// Shutting down, or a part failed and its error says why.
		return nil
	default:
		return err
	}
	<-ctx.Done()
	return nil
}

// awaitParts waits until every part of sys is ready and returns nil, or
// returns ctx's error when ctx ends first and one wrapping
// system.ErrStopped when a part stops first (a failure, which its error
// says). Every waitLogEvery meanwhile it logs the first part that is not
// ready and its reason, as GET /readyz names them.
//
// It sets no deadline. The reaper is ready only once its sweep at start
// has gone through the whole store, which takes as long as the store is
// large. Whatever else keeps a part from being ready is a request to the
// embedded server that the part tries again until it succeeds (the
// sweep, the creation of a durable consumer, the gateway's lease), as the
// same part run as a process of its own does, with no deadline either:
// giving up would not mend what makes the server refuse (its storage
// failing, say), while this log and /readyz say which part waits. A part
// that cannot start stops with its error, which ends the command. The
// steps that could hang for good, the NATS server's start and the opening
// of the buckets, keep startTimeout.
func awaitParts(ctx context.Context, log *slog.Logger, sys *system.System) error {
	start := time.Now()
	for {
		err := sys.AwaitReady(ctx, waitLogEvery)
		if !errors.Is(err, system.ErrTimeout) {
			return err
		}
		attrs := []any{"waited", time.Since(start).Round(time.Millisecond).String()}
		if p := (*metrics.PartNotReady)(nil); errors.As(err, &p) {
			attrs = append(attrs, "part", p.Part, "err", p.Err.Error())
		} else {
			attrs = append(attrs, "err", err.Error())
		}
		log.Info("waiting for a part to be ready", attrs...)
	}
}

// openBuckets creates greendot's buckets in the embedded server, and with
// feed the stream presence_feed (kept for presence.DefaultFeedMaxAge), or
// brings their configuration up to date, over a connection of the
// system's, and returns a store over them.
func openBuckets(ctx context.Context, sys *system.System, feed bool) (*presence.Store, error) {
	nc, err := sys.Connect("buckets")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil || !feed {
		return store, err
	}
	if _, err := presence.EnsureFeed(ctx, store.JetStream(), presence.BucketOptions{}, 0); err != nil {
		return nil, err
	}
	return store, nil
}

// readyLine is the one line standalone mode prints when it serves; key is
// the NKey seed file NATS takes, if it takes only that.
func readyLine(addr net.Addr, gcfg gateway.Config, demo bool, sys *system.System, key, data string) string {
	base := dialHost(addr)
	nats := "in-process only"
	if srv := sys.NATS(); srv.Addr() != nil {
		nats = "nats://" + dialHost(srv.Addr())
	}
	if key != "" {
		nats += " with the NKey in " + key
	}
	web, ws := "http", "ws"
	if gcfg.TLSCertFile != "" {
		web, ws = "https", "wss"
	}
	var how string
	switch {
	case demo:
		how = fmt.Sprintf("open %s://%s/ for the demo, or connect to %s://%s/ws?user=alice (dev auth is on: any ?user= is accepted)", web, base, ws, base)
	case gcfg.DevAuth:
		how = fmt.Sprintf("connect to %s://%s/ws?user=alice (dev auth is on: any ?user= is accepted)", ws, base)
	case gcfg.ConnectProxyURL != "" || gcfg.ConnectProxySubject != "":
		how = fmt.Sprintf("connect to %s://%s/ws with a JWT (Authorization: Bearer or ?token=) or the app's session cookie, which the connect proxy asks the app about; dev auth is off", ws, base)
	default:
		how = fmt.Sprintf("connect to %s://%s/ws with a JWT (Authorization: Bearer or ?token=); dev auth is off", ws, base)
	}
	return fmt.Sprintf("greendot standalone: %s; NATS %s; data %s", how, nats, data)
}

// dialHost returns host:port to dial a listen address at: a listener on
// every interface is reached on loopback.
func dialHost(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return addr.String()
	}
	ip := tcp.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(tcp.Port))
}

// natsAddress parses --nats-listen into the embedded server's host and
// port; port 0 picks a free port.
func natsAddress(listen string) (host string, port int, err error) {
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("--nats-listen %s: %w", quote(listen), err)
	}
	port, err = strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("--nats-listen %s: port must be 0 to 65535", quote(listen))
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// lockData creates the --data directory if it is missing and locks it, so
// that no other standalone process runs JetStream on it, and makes it
// cfg's store. The caller calls unlock once the NATS server has stopped.
func lockData(dir string, cfg *system.NATSConfig) (unlock func(), err error) {
	if dir == "" {
		return nil, errors.New("--data: want a directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	if err := os.MkdirAll(abs, 0o750); err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	cfg.StoreDir = abs
	return lockDir(abs)
}
