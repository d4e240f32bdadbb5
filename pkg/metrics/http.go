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
//	              when ready returns an error (NATS not connected, buckets missing;
//	              see Unavailable)
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
				writeStatus(w, http.StatusServiceUnavailable, Unavailable(err))
				return
			}
		}
		writeStatus(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", Handler(g))
	return mux
}

// PartNotReady is the readiness error of a process that runs several parts
// (standalone mode: an embedded NATS server, a gateway, a reaper ...): Err
// is what the part itself says, and Part names it.
type PartNotReady struct {
	Part string
	Err  error
}

func (e *PartNotReady) Error() string { return e.Part + ": " + e.Err.Error() }

func (e *PartNotReady) Unwrap() error { return e.Err }

// Unavailable returns the body of a /readyz answer 503 for the readiness
// error err: {"status":"unavailable","error":"..."}. When err is a
// PartNotReady, "part" names the part and "error" is the part's own
// reason: {"status":"unavailable","part":"reaper","error":"..."}.
func Unavailable(err error) map[string]string {
	if p, ok := err.(*PartNotReady); ok {
		return map[string]string{"status": "unavailable", "part": p.Part, "error": p.Err.Error()}
	}
	return map[string]string{"status": "unavailable", "error": err.Error()}
}

func writeStatus(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
