package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/greendot/greendot/pkg/version"
)

// DefaultTimeout bounds the work of one admin request unless its Endpoint
// says otherwise.
const DefaultTimeout = 10 * time.Second

// ReadyTimeout bounds the readiness check of one Info, so that the info
// answers within the couple of seconds an operator waits for it (`nats req
// --timeout=2s`) even when JetStream does not answer: the process is then
// reported not ready.
const ReadyTimeout = time.Second

// Endpoint is one admin endpoint of a service.
type Endpoint struct {
	// Name is the endpoint's name, as `nats micro info` lists it.
	Name string
	// Subject is the subject it listens on.
	Subject string
	// Broadcast makes every instance of the service receive each request
	// (no queue group); otherwise one instance answers.
	Broadcast bool
	// Timeout bounds the work of one request; zero means DefaultTimeout.
	Timeout time.Duration
	// Handle answers a request's payload with a value, sent as JSON, or an
	// error (ErrBadRequest, ErrUnavailable, or anything else as an internal
	// error). ctx ends when Timeout passes or the service stops; an error
	// once the service stops is answered as ErrUnavailable. Requests
	// to one endpoint are handled one at a time, in order.
	Handle func(ctx context.Context, data []byte) (any, error)
}

// ServiceConfig describes a process's micro service.
type ServiceConfig struct {
	// Name is the micro service name (GatewayService, ...).
	Name string
	// Description is shown by `nats micro info`.
	Description string
	// InfoSubject is where the service answers its Info (broadcast).
	InfoSubject string
	// ID is the process's own id, if it has one (a gateway's id).
	ID string
	// Config is the process's configuration, with defaults filled in. It is
	// part of every Info, and its entries are the service's micro metadata
	// (as strings), which `nats micro info` shows.
	Config map[string]any
	// Load reports what the process holds now. It is part of every Info and
	// of the info endpoint's data in `nats micro stats`. It is called while
	// micro holds its lock: it must be quick and must not block.
	Load func() map[string]any
	// Ready reports whether the process is ready (NATS connected, buckets
	// present); nil means always ready. An Info gives it ReadyTimeout:
	// past that the process is reported not ready.
	Ready func(context.Context) error
	// Endpoints are the service's endpoints besides info.
	Endpoints []Endpoint
	// Logger receives errors of handlers and of the service's
	// subscriptions; nil discards them.
	Logger *slog.Logger
}

// Server is a running micro service. It is safe for concurrent use.
type Server struct {
	nc      *nats.Conn
	svc     micro.Service
	cfg     ServiceConfig
	log     *slog.Logger
	version string
	started time.Time

	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	stopped  bool
	inflight sync.WaitGroup
}

// Start registers the micro service described by cfg on nc and starts
// answering requests, on nc's own goroutines. It returns once the NATS
// server has the service's subscriptions. The caller owns nc and calls
// Stop before closing it.
func Start(nc *nats.Conn, cfg ServiceConfig) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Load == nil {
		cfg.Load = func() map[string]any { return map[string]any{} }
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{nc: nc, cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel, version: version.String(), started: time.Now().UTC()}

	md := make(map[string]string, len(cfg.Config)+1)
	for k, v := range cfg.Config {
		md[k] = fmt.Sprint(v)
	}
	if cfg.ID != "" {
		md["id"] = cfg.ID
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        cfg.Name,
		Version:     s.version,
		Description: cfg.Description,
		Metadata:    md,
		StatsHandler: func(e *micro.Endpoint) any {
			if e.Name != InfoEndpoint {
				return struct{}{}
			}
			return cfg.Load()
		},
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			s.log.Error("admin service", "subject", err.Subject, "err", err.Description)
		},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("micro service %s: %w", cfg.Name, err)
	}
	s.svc = svc
	endpoints := append([]Endpoint{{
		Name:      InfoEndpoint,
		Subject:   cfg.InfoSubject,
		Broadcast: true,
		Handle:    func(ctx context.Context, _ []byte) (any, error) { return s.Info(ctx), nil },
	}}, cfg.Endpoints...)
	for _, e := range endpoints {
		opts := []micro.EndpointOpt{micro.WithEndpointSubject(e.Subject)}
		if e.Broadcast {
			opts = append(opts, micro.WithEndpointQueueGroupDisabled(),
				micro.WithEndpointMetadata(map[string]string{"delivery": "broadcast"}))
		} else {
			opts = append(opts, micro.WithEndpointMetadata(map[string]string{"delivery": "queue"}))
		}
		if err := svc.AddEndpoint(e.Name, s.handler(e), opts...); err != nil {
			_ = svc.Stop()
			cancel()
			return nil, fmt.Errorf("micro endpoint %s: %w", e.Subject, err)
		}
	}
	// Once Start returns, the server knows every subscription: a request
	// sent on another connection reaches this instance.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		_ = svc.Stop()
		cancel()
		return nil, fmt.Errorf("micro service %s: flush: %w", cfg.Name, err)
	}
	return s, nil
}

// Instance returns the service instance's micro id, as `nats micro ls`
// shows it.
func (s *Server) Instance() string { return s.svc.Info().ID }

// Info returns what the info endpoint answers now.
func (s *Server) Info(ctx context.Context) Info {
	in := Info{
		Service:  s.cfg.Name,
		Instance: s.svc.Info().ID,
		ID:       s.cfg.ID,
		Version:  s.version,
		Started:  s.started,
		Ready:    true,
		Config:   maps.Clone(s.cfg.Config),
		Load:     s.cfg.Load(),
	}
	if s.cfg.Ready != nil {
		ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
		defer cancel()
		if err := s.cfg.Ready(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("not known within %v: %w", ReadyTimeout, err)
			}
			in.Ready, in.NotReady = false, err.Error()
		}
	}
	return in
}

// Stop deregisters the service, stops taking requests, and waits for the
// requests being handled to finish (their contexts are canceled). It is
// safe to call more than once.
func (s *Server) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()
	err := s.svc.Stop()
	s.cancel()
	s.inflight.Wait()
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("stop micro service %s: %w", s.cfg.Name, err)
	}
	return nil
}

type instanceKey struct{}

// InstanceOf returns the micro instance id of the service handling the
// request whose context is ctx, or "" outside a handler.
func InstanceOf(ctx context.Context) string {
	id, _ := ctx.Value(instanceKey{}).(string)
	return id
}

// enter admits a request unless the server is stopping.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.inflight.Add(1)
	return true
}

func (s *Server) handler(e Endpoint) micro.Handler {
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return micro.HandlerFunc(func(req micro.Request) {
		if !s.enter() {
			s.respondError(req, fmt.Errorf("%w: the service is stopping", ErrUnavailable))
			return
		}
		defer s.inflight.Done()
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		defer cancel()
		ctx = context.WithValue(ctx, instanceKey{}, s.svc.Info().ID)
		v, err := e.Handle(ctx, req.Data())
		if err != nil && s.ctx.Err() != nil && !errors.Is(err, ErrBadRequest) {
			// Stop cut the request off: the process is stopping.
			err = fmt.Errorf("%w: the service is stopping: %v", ErrUnavailable, err)
		}
		if err != nil {
			s.respondError(req, err)
			return
		}
		data, err := json.Marshal(v)
		if err != nil {
			s.respondError(req, fmt.Errorf("encode reply: %w", err))
			return
		}
		// A reply the server would refuse is never sent: the requester
		// would wait for it until its timeout, knowing nothing.
		if limit := s.nc.MaxPayload(); int64(len(data)) > limit {
			s.respondError(req, fmt.Errorf("the reply is %d bytes, more than the %d the NATS server takes (max_payload)", len(data), limit))
			return
		}
		if err := req.Respond(data); err != nil {
			s.log.Error("admin reply", "subject", req.Subject(), "err", err)
		}
	})
}

// respondError answers a request with a micro error.
func (s *Server) respondError(req micro.Request, err error) {
	code, name := errorCode(err)
	if code == CodeInternal {
		s.log.Error("admin request", "subject", req.Subject(), "err", err)
	} else if s.log.Enabled(s.ctx, slog.LevelDebug) {
		s.log.LogAttrs(s.ctx, slog.LevelDebug, "admin request refused", slog.String("subject", req.Subject()), slog.Any("err", err))
	}
	body, _ := json.Marshal(ErrorBody{Error: name, Message: err.Error()})
	if rerr := req.Error(code, err.Error(), body); rerr != nil {
		s.log.Error("admin reply", "subject", req.Subject(), "err", rerr)
	}
}
