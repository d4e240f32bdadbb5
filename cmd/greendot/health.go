package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/pkg/metrics"
)

// serveHealth serves metrics.OpsHandler (/healthz, /readyz, /metrics) on
// ln until ctx is canceled, then shuts the server down and returns nil. It
// closes ln. g is the process's metrics registry: a service that has one
// of its own passes it here.
func serveHealth(ctx context.Context, ln net.Listener, g prometheus.Gatherer, ready func(context.Context) error, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           metrics.OpsHandler(g, ready),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	log.Info("health and metrics serving", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("health server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("health server: %w", err)
	}
	return nil
}
