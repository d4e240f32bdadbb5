package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/web"
	"github.com/greendot/greendot/webhook"
)

func gatewayCommand() *cli.Command {
	return &cli.Command{
		Name:  "gateway",
		Usage: "run a gateway: client WebSockets on /ws and the HTTP API, against a NATS server",
		Description: "A gateway authenticates clients (JWTs, or dev auth), holds a lease under which it keeps a\n" +
			"connection key per socket, writes users' statuses and delivers presence changes to watching\n" +
			"sockets. It serves GET /healthz, /readyz, /metrics and the browser client (/greendot.js) on\n" +
			"--listen. Run as many as you need behind a load balancer.",
		Flags:        concat(gatewayFlags(false), natsFlags(), logFlags()),
		OnUsageError: usageError,
		Action:       runGateway,
	}
}

func reaperCommand() *cli.Command {
	return &cli.Command{
		Name:         "reaper",
		Usage:        "run a reaper: the ends of gateway leases to offline",
		Description:  "Reapers share their work through a durable NATS consumer: run two or more for availability.",
		Flags:        concat(reaperFlags(), natsFlags(), logFlags()),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			log, buckets, err := processSetup(c)
			if err != nil {
				return err
			}
			cfg, err := reaperConfig(c, log, buckets)
			if err != nil {
				return err
			}
			return runWorker(c, log, "reaper", func(nc *nats.Conn) (worker, error) { return reaper.New(nc, cfg) })
		},
	}
}

func fanoutCommand() *cli.Command {
	return &cli.Command{
		Name:         "fanout",
		Usage:        "run a fanout: status changes to presence events for the gateways",
		Description:  "Fanouts share their work through a durable NATS consumer: run two or more for availability.",
		Flags:        concat(fanoutFlags(), natsFlags(), logFlags()),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			log, buckets, err := processSetup(c)
			if err != nil {
				return err
			}
			cfg, err := fanoutConfig(c, log, buckets)
			if err != nil {
				return err
			}
			return runWorker(c, log, "fanout", func(nc *nats.Conn) (worker, error) { return fanout.New(nc, cfg) })
		},
	}
}

func webhooksCommand() *cli.Command {
	return &cli.Command{
		Name:  "webhooks",
		Usage: "run a webhooks process: users' presence transitions POSTed to the app's backend",
		Description: "It consumes the revisions of presence_status, as the stream presence_feed keeps them, through a\n" +
			"durable NATS consumer (--consumer) and POSTs JSON batches of events to --url, signed with HMAC-SHA256\n" +
			"(header Greendot-Signature: t=<unix>,v1=<hex>), retried with backoff, in order per user. Create the\n" +
			"stream first with `greendot buckets --feed`: without it the process does not start. Run two or more\n" +
			"on one consumer for availability: one serves at a time. Run one consumer per endpoint.",
		Flags:        concat(webhooksFlags(), natsFlags(), logFlags()),
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			log, buckets, err := processSetup(c)
			if err != nil {
				return err
			}
			cfg, err := webhookConfig(c, "", log, buckets)
			if err != nil {
				return err
			}
			return runWorker(c, log, "webhooks", func(nc *nats.Conn) (worker, error) { return webhook.New(nc, cfg) })
		},
	}
}

// processSetup refuses positional arguments, and reads the logging and
// bucket flags every process has.
func processSetup(c *cli.Context) (*slog.Logger, presence.BucketOptions, error) {
	if c.Args().Present() {
		return nil, presence.BucketOptions{}, fmt.Errorf("unexpected argument %s: greendot %s takes only flags", quote(c.Args().First()), c.Command.Name)
	}
	log, err := newLogger(c)
	if err != nil {
		return nil, presence.BucketOptions{}, err
	}
	buckets, err := bucketOptions(c)
	return log, buckets, err
}

func runGateway(c *cli.Context) error {
	log, buckets, err := processSetup(c)
	if err != nil {
		return err
	}
	cfg, err := gatewayConfig(c, log, buckets)
	if err != nil {
		return err
	}
	if err := gatewayAuth(c, &cfg, log, false); err != nil {
		return err
	}
	cfg.Static = web.Handler(web.Options{Logger: log}) // the browser client, /greendot.js
	ln, err := listenGateway(c.String("listen"))
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	name := "greendot gateway"
	if cfg.ID != "" {
		name += " " + cfg.ID
	}
	nc, err := natsconn.Connect(natsOptions(c, name, log))
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer closeNATS(nc)
	svc, err := gateway.New(nc, cfg)
	if err != nil {
		_ = ln.Close()
		return err
	}
	return svc.Serve(c.Context, ln)
}

// worker is a reaper, fanout or webhooks service.
type worker interface {
	// Run runs the service until ctx is canceled.
	Run(ctx context.Context) error
	// Ready reports whether the service runs and reaches its buckets.
	Ready(ctx context.Context) error
	// Registry holds the service's metrics.
	Registry() *prometheus.Registry
}

var (
	_ worker = (*reaper.Service)(nil)
	_ worker = (*fanout.Service)(nil)
	_ worker = (*webhook.Service)(nil)
)

// listenGateway listens on a gateway's --listen address. Its connections
// get no TCP keepalive: the gateway finds a silent client itself (no frame
// for the connection TTL) and closes an idle HTTP connection after the
// handshake timeout, and the keepalive's four socket options were system
// calls at every accept.
func listenGateway(addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	return lc.Listen(context.Background(), "tcp", addr)
}

// runWorker runs a reaper, fanout or webhooks process until the command's context is
// canceled, with the health and metrics server of --metrics-listen beside
// it. newWorker builds the service over the process's NATS connection.
func runWorker(c *cli.Context, log *slog.Logger, kind string, newWorker func(*nats.Conn) (worker, error)) error {
	var ln net.Listener
	if addr := c.String("metrics-listen"); addr != "" {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
	}
	closeLn := func() {
		if ln != nil {
			_ = ln.Close()
		}
	}
	nc, err := natsconn.Connect(natsOptions(c, "greendot "+kind, log))
	if err != nil {
		closeLn()
		return err
	}
	defer closeNATS(nc)
	w, err := newWorker(nc)
	if err != nil {
		closeLn()
		return err
	}

	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	var (
		wg        sync.WaitGroup
		healthErr error
	)
	if ln != nil {
		wg.Go(func() {
			if healthErr = serveHealth(ctx, ln, w.Registry(), w.Ready, log); healthErr != nil {
				cancel()
			}
		})
	}
	runErr := w.Run(ctx)
	cancel()
	wg.Wait()
	return errors.Join(runErr, healthErr)
}

// closeNATS sends what is buffered and closes nc.
func closeNATS(nc *nats.Conn) {
	_ = nc.FlushTimeout(2 * time.Second)
	nc.Close()
}
