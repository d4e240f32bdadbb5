// Package natsconn connects greendot processes to NATS with the options they
// share: URL, credentials, TLS, reconnect behaviour and connection logging.
package natsconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// Options says how to connect. The zero value connects to DefaultURL without
// credentials.
type Options struct {
	// URL is a comma-separated list of server URLs; empty means DefaultURL.
	URL string
	// Name is the connection name servers show (`nats server report
	// connections`); it should say which process this is.
	Name string
	// User and Password authenticate with a user name and password.
	User, Password string
	// Token authenticates with a token.
	Token string
	// CredsFile is a decentralized-auth credentials file (JWT and seed).
	CredsFile string
	// NKeyFile is a file holding an NKey seed.
	NKeyFile string
	// CAFile, CertFile and KeyFile configure TLS: a CA to verify servers
	// with, and a client certificate for mutual TLS.
	CAFile, CertFile, KeyFile string
	// Logger receives connection lifecycle events; nil means slog.Default().
	Logger *slog.Logger
	// Extra are further options applied last.
	Extra []nats.Option
}

// DefaultURL is the NATS server a process connects to when no URL is given.
const DefaultURL = "nats://127.0.0.1:4222"

// Connect connects to NATS. It keeps reconnecting forever after the first
// connection succeeds, also while the servers refuse its credentials (a
// password being changed, credentials expired): each refusal is logged;
// buffered publishes are sent once it is back.
func Connect(o Options) (*nats.Conn, error) {
	opts, err := o.natsOptions()
	if err != nil {
		return nil, err
	}
	url := o.URL
	if url == "" {
		url = DefaultURL
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", url, err)
	}
	return nc, nil
}

func (o Options) natsOptions() ([]nats.Option, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		// nats.go closes the connection for good when a server refuses
		// its credentials twice in a row, which would leave the process
		// running, never ready again.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.Timeout(5 * time.Second),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err == nil && nc.IsClosed() {
				return // closed on purpose, at shutdown
			}
			log.Warn("nats disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Error("nats async error", "subject", sub.Subject, "err", err)
				return
			}
			log.Error("nats async error", "err", err)
		}),
	}
	n := 0
	if o.User != "" || o.Password != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
		n++
	}
	if o.Token != "" {
		opts = append(opts, nats.Token(o.Token))
		n++
	}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
		n++
	}
	if o.NKeyFile != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("nkey seed %s: %w", o.NKeyFile, err)
		}
		opts = append(opts, opt)
		n++
	}
	if n > 1 {
		return nil, errors.New("nats: give only one of user/password, token, creds or nkey")
	}
	if o.CAFile != "" {
		opts = append(opts, nats.RootCAs(o.CAFile))
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("nats: a client certificate needs both the cert and the key file")
	}
	if o.CertFile != "" {
		opts = append(opts, nats.ClientCert(o.CertFile, o.KeyFile))
	}
	return append(opts, o.Extra...), nil
}

// OnReconnect calls fn each time nc's connection to NATS comes back after
// being lost, one call at a time, until ctx is canceled.
func OnReconnect(ctx context.Context, nc *nats.Conn, fn func()) {
	ch := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			fn()
		}
	}
}
