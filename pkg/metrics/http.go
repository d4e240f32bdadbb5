package metrics

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ReadyTimeout bounds one readiness check of OpsHandler.
const ReadyTimeout = 2 * time.Second

// OpsHandler serves what a process without an HTTP API of its own (the
// reaper, the fanout) offers operators on --metrics-listen:
//
//	GET /healthz  200 {"status":"ok"} while the process runs
//	GET /readyz   200 {"status":"ready"}, or 503 {"status":"unavailable","error":"..."}
//	              when ready returns an error (NATS not connected, buckets missing)
//	GET /metrics  the metrics gathered by g, in the Prometheus text format
//
// A nil ready means always ready; a readiness check gets ReadyTimeout.
func OpsHandler(g prometheus.Gatherer, ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
			defer cancel()
			if err := ready(ctx); err != nil {
				writeStatus(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": err.Error()})
				return
			}
		}
		writeStatus(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", Handler(g))
	return mux
}

func writeStatus(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
