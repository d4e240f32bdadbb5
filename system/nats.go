package system

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultStartTimeout bounds the start of an embedded NATS server and the
// wait for a service to be ready, unless a caller says otherwise.
const DefaultStartTimeout = 30 * time.Second

// NATSConfig configures an embedded NATS server with JetStream.
type NATSConfig struct {
	// Options is the configuration to start from, such as one loaded with
	// server.ProcessConfigFile; nil means an empty one. StartNATS does not
	// change it: it works on a copy, with JetStream on, the server's own
	// signal handling off, and the fields below applied.
	Options *server.Options
	// Name is the server's name; empty keeps Options' (nats-server's
	// default is the server's generated id).
	Name string
	// StoreDir is the JetStream store directory; empty keeps Options'. One
	// of the two must name it.
	StoreDir string
	// Host and Port are the client address. A Host that is not empty
	// replaces Options' host, and a Port that is not zero its port
	// (server.RANDOM_PORT picks a free one). With neither Options nor a
	// Port, the server listens on a free port, on 127.0.0.1 unless Host
	// says otherwise.
	Host string
	Port int
	// InProcessOnly starts no client listener: clients connect with
	// nats.InProcessServer only. It overrides Host and Port.
	InProcessOnly bool
	// MaxPending bounds the bytes pending for one client connection; zero
	// keeps Options' (nats-server's default is 64 MiB).
	MaxPending int64
	// StartTimeout bounds the start; zero means DefaultStartTimeout.
	StartTimeout time.Duration
	// Logger receives the server's log, with "svc"="nats": its notices at
	// debug level (they are routine), its warnings and errors at theirs.
	// Nil discards it.
	Logger *slog.Logger
}

// serverOptions returns the options the server starts with.
func (c NATSConfig) serverOptions() (*server.Options, error) {
	o := &server.Options{}
	if c.Options != nil {
		o = c.Options.Clone()
	}
	o.JetStream = true
	o.NoSigs = true
	if c.Name != "" {
		o.ServerName = c.Name
	}
	if c.StoreDir != "" {
		o.StoreDir = c.StoreDir
	}
	if o.StoreDir == "" {
		return nil, errors.New("nats server: no JetStream store directory")
	}
	switch {
	case c.InProcessOnly:
		o.DontListen = true
	case c.Options == nil && c.Port == 0:
		o.Host, o.Port = "127.0.0.1", server.RANDOM_PORT
	}
	if c.Host != "" && !c.InProcessOnly {
		o.Host = c.Host
	}
	if c.Port != 0 && !c.InProcessOnly {
		o.Port = c.Port
	}
	if c.MaxPending != 0 {
		o.MaxPending = c.MaxPending
	}
	return o, nil
}

// StartNATS starts an embedded NATS server with JetStream and returns it
// once it accepts connections and JetStream runs. The caller owns the
// server: it stops it with Shutdown, then WaitForShutdown. A fatal error of
// the server never ends the process: during the start StartNATS returns it,
// later it is logged.
func StartNATS(cfg NATSConfig) (*server.Server, error) {
	opts, err := cfg.serverOptions()
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nlog := &natsLogger{log: log.With("svc", "nats"), fatal: make(chan error, 1)}
	srv.SetLoggerV2(nlog, false, false, false)
	go srv.Start()

	fail := func(err error) (*server.Server, error) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, err
	}
	timeout := cmp.Or(cfg.StartTimeout, DefaultStartTimeout)
	deadline := time.Now().Add(timeout)
	for ready := false; !ready; {
		ready = srv.ReadyForConnections(50 * time.Millisecond)
		select {
		case err := <-nlog.fatal:
			return fail(err)
		default:
		}
		if !ready && time.Now().After(deadline) {
			return fail(fmt.Errorf("nats server not ready after %v: %w", timeout, ErrTimeout))
		}
	}
	if !srv.JetStreamEnabled() {
		return fail(errors.New("nats server: JetStream did not start"))
	}
	nlog.started.Store(true)
	return srv, nil
}

// natsReady reports whether srv accepts connections and runs JetStream,
// as its monitoring endpoint's /healthz?js-enabled-only=true does: a
// server that disabled JetStream (as it does on a storage failure) is not
// ready.
func natsReady(srv *server.Server) error {
	if h := srv.Healthz(&server.HealthzOptions{JSEnabledOnly: true}); h.StatusCode != http.StatusOK {
		return errors.New(cmp.Or(h.Error, h.Status))
	}
	return nil
}

// natsLogger writes an embedded NATS server's log through slog. A fatal
// error never ends the process: during the start it is reported on fatal,
// for StartNATS to return, and later it is logged.
type natsLogger struct {
	log     *slog.Logger
	fatal   chan error
	started atomic.Bool
}

// startError is a fatal error of the NATS server while it starts: its
// message, and the error the message holds (a *net.OpError for a port
// in use), if any.
type startError struct {
	msg string
	err error
}

func (e *startError) Error() string { return "nats server: " + e.msg }

func (e *startError) Unwrap() error { return e.err }

var _ server.Logger = (*natsLogger)(nil)

func (l *natsLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }

func (l *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if !l.started.Load() {
		err := &startError{msg: msg}
		for _, a := range v {
			if e, ok := a.(error); ok {
				err.err = e
				break
			}
		}
		select {
		case l.fatal <- err:
		default:
		}
		return
	}
	l.log.Error(msg)
}
