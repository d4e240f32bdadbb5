package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// deadliner is a listener whose Accept a deadline can interrupt, as a TCP
// listener's can.
type deadliner interface {
	net.Listener
	SetDeadline(t time.Time) error
}

// serveStarting answers on ln while the gateway starts, before it serves
// clients: GET /healthz (the process is alive), GET /readyz (503, with
// what the start waits for: its lease, say) and GET /metrics; anything
// else, a WebSocket upgrade included, is refused with 503 "the gateway is
// starting", which clients take as "try again". An orchestrator's probes
// thus get answers at once, where the connections would otherwise wait in
// the listen queue until the start is over, however long a lease that
// cannot be taken makes it. Each connection serves one request. The
// returned stop ends it, without closing ln, and waits for the answers
// under way (for a second at most); Serve then serves ln itself. A listener whose Accept cannot
// be interrupted is not served until then.
func (s *Service) serveStarting(ln net.Listener) (stop func()) {
	dl, ok := ln.(deadliner)
	if !ok {
		return func() {}
	}
	mux := http.NewServeMux()
	handleProbes(mux, s.readyz(), s.gathered(), false)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the gateway is starting; try again")
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: s.cfg.HandshakeTimeout,
		ReadTimeout:       s.cfg.HandshakeTimeout,
		WriteTimeout:      s.cfg.HandshakeTimeout + s.cfg.WriteTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	srv.SetKeepAlivesEnabled(false)
	httpLn := newChanListener(ln.Addr())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(httpLn) })
	stopping := make(chan struct{})
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		var delay time.Duration
		for {
			nc, err := ln.Accept()
			select {
			case <-stopping:
				// The deadline that woke Accept, or a connection
				// accepted at that moment: Serve's loop takes the next.
				if err == nil && !httpLn.deliver(nc) {
					_ = nc.Close()
				}
				return
			default:
			}
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// Out of files, most often: back off, as the accept
				// loop does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Warn("accept while starting", "err", err, "retry_in", delay)
				select {
				case <-stopping:
					return
				case <-time.After(delay):
				}
				continue
			}
			delay = 0
			if !httpLn.deliver(nc) {
				_ = nc.Close()
				return
			}
		}
	}()
	return func() {
		close(stopping)
		_ = dl.SetDeadline(time.Now())
		<-accepted
		_ = dl.SetDeadline(time.Time{})
		// Answers under way get a moment to finish; a connection that
		// sent nothing yet is not waited for.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
		cancel()
		wg.Wait()
	}
}
