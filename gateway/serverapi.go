package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/greendot/greendot/gateway/internal/apikeys"
	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/gateway/internal/keyrate"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// serverAPI is the API a backend calls with a key of Config.APIKeysFile
// rather than a user's token: any user's presence and any room's members
// (scope presence:read), and a user's chosen and custom status set from
// the server (status:write). Each request is limited per key, apart from
// users, and logged with the key's name.
type serverAPI struct {
	keys    *apikeys.Set
	byKey   *keyrate.Limiter
	byAddr  *keyrate.Limiter
	log     *slog.Logger
	metrics *gatewayMetrics
	store   *presence.Store
	events  *presence.Publisher
	// presenceOf reads a user's presence, last_seen included
	// (Service.presenceOf): a backend is not a watcher.
	presenceOf func(ctx context.Context, userID string) (presence.Presence, uint64, int64, error)
	cfg        *Config
	ready      func() bool
}

// ServerAPIPrefix is where the server API's paths are.
const ServerAPIPrefix = "/api/server/"

// maxServerQuery bounds the users of one POST /api/server/query.
const maxServerQuery = 500

func (a *serverAPI) routes(mux *http.ServeMux, route func(mux *http.ServeMux, method, path string, h http.HandlerFunc)) {
	route(mux, "GET", ServerAPIPrefix+"users/{id}", a.keyed(apikeys.PresenceRead, a.getUser))
	route(mux, "POST", ServerAPIPrefix+"query", a.keyed(apikeys.PresenceRead, a.query))
	route(mux, "GET", ServerAPIPrefix+"rooms/{room}", a.keyed(apikeys.PresenceRead, a.getRoom))
	route(mux, "PUT", ServerAPIPrefix+"users/{id}/status", a.keyed(apikeys.StatusWrite, a.putStatus))
	route(mux, "PUT", ServerAPIPrefix+"users/{id}/custom_status", a.keyed(apikeys.StatusWrite, a.putCustom))
}

// keyed answers a request with h when it carries a key with scope, and
// logs it: the key's name, the request, the answer's status.
func (a *serverAPI) keyed(scope apikeys.Scope, h func(http.ResponseWriter, *http.Request, *apikeys.Key)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if !allowRate(w, a.byAddr, a.metrics, "address", clientAddress(r, a.cfg.TrustedProxies)) {
			return
		}
		key, ok := a.key(r)
		if !ok {
			a.metrics.serverAPI.WithLabelValues("", "401").Inc()
			writeError(w, http.StatusUnauthorized, protocol.CodeUnauthorized, "the server API takes Authorization: Bearer <an API key of --api-keys-file>")
			return
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			a.metrics.serverAPI.WithLabelValues(key.Name, strconv.Itoa(sw.status)).Inc()
			a.log.Info("server API", "key", key.Name, "addr", clientAddress(r, a.cfg.TrustedProxies), "method", r.Method, "path", r.URL.Path, "status", sw.status,
				"took", time.Since(start).Round(time.Microsecond).String())
		}()
		switch {
		case !key.Allows(scope):
			writeError(sw, http.StatusForbidden, protocol.ReasonNotAllowed, fmt.Sprintf("key %q has no scope %s", key.Name, scope))
		case !allowRate(sw, a.byKey, a.metrics, "key", key.Name):
		case !a.ready():
			writeError(sw, http.StatusServiceUnavailable, "unavailable", "the gateway is not ready")
		default:
			h(sw, r, key)
		}
	}
}

// key returns the key a request's Authorization header carries.
func (a *serverAPI) key(r *http.Request) (*apikeys.Key, bool) {
	h := r.Header.Values("Authorization")
	if len(h) != 1 {
		return nil, false
	}
	secret, ok := strings.CutPrefix(h[0], "Bearer ")
	if !ok || secret == "" {
		return nil, false
	}
	return a.keys.Lookup(secret)
}

// statusWriter notes the status of an answer, for the log.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

func badUserID(w http.ResponseWriter) {
	writeError(w, http.StatusBadRequest, protocol.ReasonInvalidUserID, fmt.Sprintf("user ids are 1 to %d characters of A-Z a-z 0-9 _ -", presence.MaxUserIDLen))
}

// getUser answers GET /api/server/users/{id}.
func (a *serverAPI) getUser(w http.ResponseWriter, r *http.Request, _ *apikeys.Key) {
	user := r.PathValue("id")
	if !presence.ValidUserID(user) {
		badUserID(w)
		return
	}
	p, _, _, err := a.presenceOf(r.Context(), user)
	if err != nil {
		unavailableHTTP(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// query answers POST /api/server/query {"user_ids": [...]}.
func (a *serverAPI) query(w http.ResponseWriter, r *http.Request, _ *apikeys.Key) {
	var q struct {
		UserIDs idList `json:"user_ids"`
	}
	if err := decodeBody(r, &q); err != nil || !q.UserIDs.given {
		writeError(w, http.StatusBadRequest, protocol.CodeBadRequest, `want {"user_ids": [up to 500 user ids]}`)
		return
	}
	ids := q.UserIDs.ids
	if len(ids) > maxServerQuery {
		writeError(w, http.StatusBadRequest, protocol.CodeBadRequest, fmt.Sprintf("%d user ids: at most %d", len(ids), maxServerQuery))
		return
	}
	grants := make([]hub.Grant, len(ids))
	for i, id := range ids {
		if !presence.ValidUserID(id) {
			badUserID(w)
			return
		}
		// A backend is not a watcher: last_seen whatever the privacy.
		grants[i] = hub.Grant{User: id, LastSeen: true}
	}
	users, err := readPresences(r.Context(), a.presenceOf, grants)
	if err != nil {
		unavailableHTTP(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"users": users})
}

// getRoom answers GET /api/server/rooms/{room}.
func (a *serverAPI) getRoom(w http.ResponseWriter, r *http.Request, _ *apikeys.Key) {
	roomID := r.PathValue("room")
	if !presence.ValidRoomID(roomID) {
		writeError(w, http.StatusBadRequest, protocol.ReasonInvalidRoom,
			fmt.Sprintf("room ids are 1 to %d characters of A-Z a-z 0-9 _ - and :", presence.MaxRoomIDLen))
		return
	}
	entries, err := a.store.RoomMembers(r.Context(), roomID)
	if err != nil {
		unavailableHTTP(w, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotOf(roomID, entries, a.cfg.RoomMembersMax))
}

// putStatus answers PUT /api/server/users/{id}/status {"status": "busy"}:
// the user's chosen status, as if they chose it, offline too.
func (a *serverAPI) putStatus(w http.ResponseWriter, r *http.Request, _ *apikeys.Key) {
	user := r.PathValue("id")
	if !presence.ValidUserID(user) {
		badUserID(w)
		return
	}
	var body struct {
		Status string `json:"status"`
	}
	if err := decodeBody(r, &body); err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeBadRequest, `want {"status": "online"|"away"|"busy"|"invisible"}`)
		return
	}
	st, err := presence.ParseChosen(body.Status)
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidStatus, err.Error())
		return
	}
	a.write(w, r, user, func(rec *presence.Record) error {
		if rec.ChosenStatus() == st {
			return presence.ErrNoChange
		}
		rec.Chosen = st
		return nil
	})
}

// putCustom answers PUT /api/server/users/{id}/custom_status with
// {"text", "emoji", "expires_at"}, as set_custom_status takes them ({}
// clears it).
func (a *serverAPI) putCustom(w http.ResponseWriter, r *http.Request, _ *apikeys.Key) {
	user := r.PathValue("id")
	if !presence.ValidUserID(user) {
		badUserID(w)
		return
	}
	var body struct {
		Text      string `json:"text"`
		Emoji     string `json:"emoji"`
		ExpiresAt int64  `json:"expires_at"`
	}
	if err := decodeBody(r, &body); err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeBadRequest, `want {"text", "emoji", "expires_at"}, each optional ({} clears it)`)
		return
	}
	custom, err := presence.ParseCustom(body.Text, body.Emoji, body.ExpiresAt, time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, protocol.CodeInvalidCustom, err.Error())
		return
	}
	if custom != nil && custom.ExpiresAt != 0 {
		if err := a.store.SetCustomTimer(r.Context(), user, custom.ExpiresAt); err != nil {
			unavailableHTTP(w, err)
			return
		}
	}
	a.write(w, r, user, func(rec *presence.Record) error {
		if rec.Custom.Equal(custom) {
			return presence.ErrNoChange
		}
		rec.Custom = custom
		return nil
	})
}

// write changes a user's record by compare-and-set, publishes the events
// of the write, and answers with the user's presence as others see it.
func (a *serverAPI) write(w http.ResponseWriter, r *http.Request, user string, mutate func(*presence.Record) error) {
	wr, err := a.store.WriteStatus(r.Context(), user, &presence.Cached{}, mutate)
	if err != nil {
		unavailableHTTP(w, err)
		return
	}
	if wr.Written {
		a.metrics.kvWrites.WithLabelValues("status").Inc()
		if _, err := a.events.Publish(user, &wr, false); err != nil {
			a.log.Warn("publish events", "user_id", user, "err", err)
		}
	}
	writeJSON(w, http.StatusOK, wr.Next.Presence(user))
}

// decodeBody decodes a request's JSON body (at most 64 KiB) into v.
func decodeBody(r *http.Request, v any) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, 64<<10+1))
	if err != nil {
		return err
	}
	if len(data) > 64<<10 {
		return errors.New("body over 64 KiB")
	}
	return json.Unmarshal(data, v)
}

// unavailableHTTP answers a request the gateway could not answer for want
// of NATS.
func unavailableHTTP(w http.ResponseWriter, err error) {
	writeError(w, http.StatusServiceUnavailable, "unavailable", "presence state is unavailable right now: "+err.Error())
}

// reloadAPIKeys reads Config.APIKeysFile again every APIKeysRefresh while
// ctx lasts; a file that cannot be read keeps the keys before.
func (s *Service) reloadAPIKeys(ctx context.Context) {
	t := time.NewTicker(s.cfg.APIKeysRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		switch changed, err := s.apiKeys.Reload(); {
		case err != nil:
			s.log.Error("API keys not read again: the keys before are kept", "err", err)
		case changed:
			s.log.Info("API keys read again", "keys", s.apiKeys.Len())
		}
	}
}

// CheckAPIKeysFile reads a file as Config.APIKeysFile would be read, and
// returns what is wrong with it, if anything: for a command line to
// refuse it before it starts anything.
func CheckAPIKeysFile(path string) error {
	_, err := apikeys.Open(path)
	return err
}
