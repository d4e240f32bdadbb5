package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/greendot/greendot/gateway/internal/authz"
	"github.com/greendot/greendot/gateway/internal/callout"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/signature"
)

// InvalidatePath is where the app POSTs an invalidation, signed, for the
// gateway to publish on InvalidateSubject.
const InvalidatePath = "/api/authz/invalidate"

// Invalidation drops cached answers of the app: those of Watcher about
// Target; an empty field matches anyone.
type Invalidation struct {
	Watcher string `json:"watcher,omitempty"`
	Target  string `json:"target,omitempty"`
}

// parseInvalidation reads an invalidation: one JSON object with at most
// the fields watcher and target, each a valid user id when present.
func parseInvalidation(data []byte) (Invalidation, error) {
	var inv Invalidation
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&inv); err != nil {
		return inv, fmt.Errorf(`want {"watcher": "<id>", "target": "<id>"}, each optional: %v`, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return inv, errors.New("want one JSON object")
	}
	for _, u := range []string{inv.Watcher, inv.Target} {
		if u != "" && !presence.ValidUserID(u) {
			return inv, fmt.Errorf("%q is not a valid user id", u)
		}
	}
	return inv, nil
}

// appSource returns the callout of the app policy; nil under others.
func (s *Service) appSource() authz.AppSource {
	switch {
	case s.cfg.Policy != PolicyApp:
		return nil
	case s.cfg.AppURL != "":
		return callout.NewHTTP(callout.HTTPConfig{
			URL: s.cfg.AppURL, Secret: s.cfg.AppSecret, Timeout: s.cfg.AppTimeout, Observe: s.metrics.callout,
		})
	default:
		return callout.NewNATS(callout.NATSConfig{
			Conn: s.nc, Subject: s.cfg.AppSubject, Timeout: s.cfg.AppTimeout, Observe: s.metrics.callout,
		})
	}
}

// invalidated applies an invalidation heard on InvalidateSubject: the
// cached answers it matches are dropped and the live subscriptions it
// matches decided again. NATS calls it for one message at a time.
func (s *Service) invalidated(ctx context.Context, data []byte) {
	inv, err := parseInvalidation(data)
	if err != nil {
		s.metrics.invalidations.WithLabelValues("invalid").Inc()
		s.log.Warn("invalidation dropped", "subject", InvalidateSubject, "err", err)
		return
	}
	s.metrics.invalidations.WithLabelValues("applied").Inc()
	s.authz.Invalidate(ctx, inv.Watcher, inv.Target)
}

// postInvalidate answers POST /api/authz/invalidate: an invalidation
// signed with the app secret, published on InvalidateSubject for every
// gateway. The source address is limited as for the rest of the API,
// before the signature is checked.
func (a *api) postInvalidate(w http.ResponseWriter, r *http.Request) {
	if !a.allowAPI(w, a.byAddr, "address", clientAddress(r, a.cfg.TrustedProxies)) {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4<<10))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "bad_request", "body over 4 KiB")
		return
	}
	if err := signature.Verify(a.cfg.AppSecret, r.Header.Get(signature.Header), body, time.Now(), 0); err != nil {
		writeError(w, http.StatusUnauthorized, "unauthorized", err.Error())
		return
	}
	inv, err := parseInvalidation(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	data, err := json.Marshal(inv)
	if err == nil {
		if err = a.nc.Publish(InvalidateSubject, data); err == nil {
			err = a.nc.FlushWithContext(ctx)
		}
	}
	if err != nil {
		a.unavailable(w, fmt.Errorf("publish %s: %w", InvalidateSubject, err))
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "published"})
}
