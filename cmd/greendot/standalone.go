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
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/web"
)

// natsStartTimeout bounds the start of the embedded NATS server.
const natsStartTimeout = 30 * time.Second

func standaloneCommand() *cli.Command {
	return &cli.Command{
		Name:  "standalone",
		Usage: "run everything in one process: an embedded NATS server with JetStream, a gateway, a reaper and a fanout",
		Description: "The NATS server stores its data under --data and also listens on --nats-listen, so the nats CLI\n" +
			"can inspect the state (nats --server nats://127.0.0.1:4222 kv ls). The gateway, reaper and fanout\n" +
			"each use their own connection to it. Dev auth (?user=<id>) is on while --listen is a loopback\n" +
			"address, and then the demo page is served at / (its endpoints write the graph for any ?user=).\n" +
			"The browser client is at /greendot.js. On SIGINT or SIGTERM the gateway drains, then the reaper\n" +
			"and fanout stop, then the NATS server.",
		Flags: concat(
			[]cli.Flag{
				stringFlag(catEmbedded, "data", "./greendot-data", "directory of the embedded NATS server's JetStream storage"),
				stringFlag(catEmbedded, "nats-listen", "127.0.0.1:4222", "client address of the embedded NATS server (port 0 picks a free port); empty for in-process connections only"),
				durationFlag(catProcess, "sweep-interval", time.Minute, "how often the reaper's full sweep of connections and statuses runs; at least 100ms"),
			},
			gatewayFlags(true),
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
	if err := positive(c, "sweep-interval"); err != nil {
		return err
	}
	rcfg := reaper.Config{Logger: log, SweepInterval: c.Duration("sweep-interval")}
	if err := rcfg.Validate(); err != nil {
		return err
	}
	fcfg := fanout.Config{Logger: log}
	natsListen := c.String("nats-listen")
	if natsListen != "" {
		loopback, err := isLoopback(natsListen)
		if err != nil {
			return fmt.Errorf("--nats-listen %s: %w", quote(natsListen), err)
		}
		if !loopback {
			log.Warn("the embedded NATS server listens on an address that is not loopback, with no authentication: anyone who reaches it can read and change all presence state",
				"addr", natsListen)
		}
	}

	ln, err := net.Listen("tcp", c.String("listen"))
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	srv, unlock, err := startNATS(c.String("data"), natsListen, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		unlock()
		log.Info("nats server stopped")
	}()

	connect := func(name string) (*nats.Conn, error) {
		return natsconn.Connect(natsconn.Options{
			URL:    srv.ClientURL(),
			Name:   "greendot standalone " + name,
			Logger: log,
			Extra:  []nats.Option{nats.InProcessServer(srv)},
		})
	}
	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			closeNATS(nc)
		}
	}()
	for _, name := range []string{"gateway", "reaper", "fanout"} {
		nc, err := connect(name)
		if err != nil {
			_ = ln.Close()
			return err
		}
		conns = append(conns, nc)
	}
	// The browser client is served at /greendot.js and, while dev auth is
	// on and only this machine can connect, the demo at /.
	loopback, err := isLoopback(c.String("listen"))
	if err != nil {
		_ = ln.Close()
		return err
	}
	demo := gcfg.DevAuth && loopback
	webOpts := web.Options{Demo: demo, Logger: log}
	if demo {
		openCtx, cancel := context.WithTimeout(c.Context, natsStartTimeout)
		webOpts.Store, err = presence.Open(openCtx, conns[0], presence.BucketOptions{})
		cancel()
		if err != nil {
			_ = ln.Close()
			return err
		}
	}
	gcfg.Static = web.Handler(webOpts)
	gw, err := gateway.New(conns[0], gcfg)
	if err != nil {
		_ = ln.Close()
		return err
	}
	rp, err := reaper.New(conns[1], rcfg)
	if err != nil {
		_ = ln.Close()
		return err
	}
	fo, err := fanout.New(conns[2], fcfg)
	if err != nil {
		_ = ln.Close()
		return err
	}

	// The gateway stops first, on the command's context or on a failure of
	// any part; the reaper and fanout stop after it has drained, so that
	// what its closing sockets wrote is still processed.
	gwCtx, stopGateway := context.WithCancel(c.Context)
	defer stopGateway()
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(c.Context))
	defer stopBackground()

	var (
		wg                     sync.WaitGroup
		gwErr, reapErr, fanErr error
		gwDone                 = make(chan struct{})
	)
	wg.Go(func() {
		defer close(gwDone)
		if gwErr = gw.Serve(gwCtx, ln); gwErr != nil {
			gwErr = fmt.Errorf("gateway: %w", gwErr)
		}
	})
	wg.Go(func() {
		if reapErr = rp.Run(bgCtx); reapErr != nil {
			reapErr = fmt.Errorf("reaper: %w", reapErr)
			stopGateway()
		}
	})
	wg.Go(func() {
		if fanErr = fo.Run(bgCtx); fanErr != nil {
			fanErr = fmt.Errorf("fanout: %w", fanErr)
			stopGateway()
		}
	})

	readyErr := awaitReady(gwCtx, gw, gwDone)
	switch {
	case readyErr == nil:
		fmt.Fprintln(c.App.Writer, readyLine(ln.Addr(), gcfg.DevAuth, demo, srv, natsListen, c.String("data")))
	case errors.Is(readyErr, errStopped) || gwCtx.Err() != nil:
		// Shutting down, or a part failed and says why itself.
		readyErr = nil
	default:
		stopGateway()
	}

	<-gwDone
	stopBackground()
	wg.Wait()
	return errors.Join(readyErr, gwErr, reapErr, fanErr)
}

// errStopped means the gateway stopped before it was ready.
var errStopped = errors.New("gateway stopped")

// awaitReady waits until the gateway is ready, it stops, or ctx ends.
func awaitReady(ctx context.Context, gw *gateway.Service, done <-chan struct{}) error {
	deadline := time.Now().Add(natsStartTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := gw.Ready(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gateway not ready after %v: %w", natsStartTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return errStopped
		case <-tick.C:
		}
	}
}

// readyLine is the one line standalone mode prints when it serves.
func readyLine(addr net.Addr, devAuth, demo bool, srv *server.Server, natsListen, data string) string {
	base := dialHost(addr)
	nats := "in-process only"
	if natsListen != "" {
		nats = "nats://" + dialHost(srv.Addr())
	}
	var how string
	switch {
	case demo:
		how = fmt.Sprintf("open http://%s/ for the demo, or connect to ws://%s/ws?user=alice (dev auth is on: any ?user= is accepted)", base, base)
	case devAuth:
		how = fmt.Sprintf("connect to ws://%s/ws?user=alice (dev auth is on: any ?user= is accepted)", base)
	default:
		how = fmt.Sprintf("connect to ws://%s/ws with a JWT (Authorization: Bearer or ?token=); dev auth is off", base)
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

// startNATS starts the embedded NATS server with JetStream, storing under
// dir, which it locks, and listening for clients on listen (no listener
// when empty; port 0 picks a free port). The caller shuts the server down,
// then calls unlock.
func startNATS(dir, listen string, log *slog.Logger) (srv *server.Server, unlock func(), err error) {
	if dir == "" {
		return nil, nil, errors.New("--data: want a directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("--data: %w", err)
	}
	if err := os.MkdirAll(abs, 0o750); err != nil {
		return nil, nil, fmt.Errorf("--data: %w", err)
	}
	release, err := lockDir(abs)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	opts := &server.Options{
		ServerName: "greendot",
		JetStream:  true,
		StoreDir:   abs,
		NoSigs:     true,
	}
	if listen == "" {
		opts.DontListen = true
	} else {
		host, portText, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, nil, fmt.Errorf("--nats-listen %s: %w", quote(listen), err)
		}
		port, err := strconv.Atoi(portText)
		if err != nil || port < 0 || port > 65535 {
			return nil, nil, fmt.Errorf("--nats-listen %s: port must be 0 to 65535", quote(listen))
		}
		if port == 0 {
			port = server.RANDOM_PORT
		}
		opts.Host, opts.Port = host, port
	}
	srv, err = server.NewServer(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("nats server: %w", err)
	}
	nlog := &natsLogger{log: log.With("svc", "nats"), fatal: make(chan string, 1)}
	srv.SetLoggerV2(nlog, false, false, false)
	go srv.Start()

	deadline := time.Now().Add(natsStartTimeout)
	for !srv.ReadyForConnections(50 * time.Millisecond) {
		select {
		case msg := <-nlog.fatal:
			srv.Shutdown()
			srv.WaitForShutdown()
			return nil, nil, fmt.Errorf("nats server: %s", msg)
		default:
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			srv.WaitForShutdown()
			return nil, nil, fmt.Errorf("nats server not ready after %v", natsStartTimeout)
		}
	}
	select {
	case msg := <-nlog.fatal:
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, nil, fmt.Errorf("nats server: %s", msg)
	default:
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, nil, errors.New("nats server: JetStream did not start")
	}
	attrs := []any{"store_dir", abs}
	if listen != "" {
		attrs = append(attrs, "url", "nats://"+dialHost(srv.Addr()))
	}
	nlog.started.Store(true)
	log.Info("nats server ready", attrs...)
	return srv, release, nil
}

// natsLogger writes the embedded NATS server's log through slog. Its
// notices are routine, so they go to debug. A fatal error never ends the
// process: during the start it is reported on fatal, for startNATS to
// return, and later it is logged.
type natsLogger struct {
	log     *slog.Logger
	fatal   chan string
	started atomic.Bool
}

func (l *natsLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }

func (l *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if !l.started.Load() {
		// startNATS returns it.
		select {
		case l.fatal <- msg:
		default:
		}
		return
	}
	l.log.Error(msg)
}
