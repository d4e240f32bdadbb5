package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/gateway/internal/authz"
	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/gateway/internal/keyrate"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// maxFriends bounds how many followed users GET /api/presence/friends
// considers.
const maxFriends = 5000

// api is the gateway's HTTP API: users' presence, global presence, the
// friends list and rooms' members, for the same identities, origins and
// authorization as the WebSocket, each request limited per source address
// and per identity. It takes what it uses of the gateway, which builds it
// once its parts are open.
type api struct {
	// nc publishes the app's invalidations.
	nc      *nats.Conn
	cfg     *Config
	log     *slog.Logger
	metrics *gatewayMetrics
	// byAddr and byUser limit the requests per source address and per
	// identity.
	byAddr, byUser *keyrate.Limiter
	authz          *authz.Authorizer
	store          *presence.Store
	// online is global presence; nil but under the everyone policy.
	online *onlineIndex

	// authenticate and checkOrigin are the WebSocket's (Service's):
	// who a request is, and whether its page's origin may ask.
	authenticate func(*credentials) (identity, error)
	checkOrigin  func(*credentials) error
	// presenceOf reads a user's presence (Service.presenceOf).
	presenceOf func(ctx context.Context, userID string) (presence.Presence, uint64, int64, error)
	// ready says whether the gateway serves.
	ready func() bool
}

// routes has mux answer the API's paths (the app's invalidations under
// the app policy with a secret), and a path under /api/ that is none of
// them with 404.
func (a *api) routes(mux *http.ServeMux) {
	a.route(mux, "GET", "/api/presence/users/{id}", a.authed(a.getUser))
	a.route(mux, "POST", "/api/presence/query", a.authed(a.query))
	a.route(mux, "GET", "/api/presence/online", a.authed(a.getOnline))
	a.route(mux, "GET", "/api/presence/friends", a.authed(a.getFriends))
	a.route(mux, "GET", "/api/rooms/{room}", a.authed(a.getRoom))
	if a.cfg.Policy == PolicyApp && len(a.cfg.AppSecret) > 0 {
		a.route(mux, "POST", InvalidatePath, a.postInvalidate)
	}
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions {
			a.preflight(w, r)
			return
		}
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("the API has nothing at %s", r.URL.Path))
	})
}

// route has mux answer path: method with h, a preflight, and any other
// method with 405.
func (a *api) route(mux *http.ServeMux, method, path string, h http.HandlerFunc) {
	mux.HandleFunc(method+" "+path, h)
	mux.HandleFunc(path, a.otherMethod(method))
}

// apiError is the body of every error answer.
type apiError struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
}

// handleProbes has mux answer GET /healthz (200 while the process runs),
// GET /readyz (200 when ready says so and the gateway serves; 503 with
// the reason otherwise) and GET /metrics, from gathered.
func handleProbes(mux *http.ServeMux, ready func(context.Context) error, gathered prometheus.Gatherer, serving bool) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		err := ready(r.Context())
		if err == nil && !serving {
			err = errors.New("the gateway is starting")
		}
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, metrics.Unavailable(err))
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", metrics.Handler(gathered))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	// Messages may quote a path as sent, unescaped: never taken for HTML.
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	// Messages quote what a client sent and what to send instead
	// ("?user=<id>"): JSON for programs, readable by people.
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, apiError{Error: code, Message: msg})
}

// authed authenticates an API request (the same identities as the
// WebSocket: a bearer token, ?token=, or ?user= with dev auth) and allows
// browsers from allowed origins.
func (a *api) authed(h func(http.ResponseWriter, *http.Request, identity)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// A page of an allowed origin may read every answer, refusals
		// and their Retry-After included.
		cr, err := credentialsFromHTTP(r)
		originErr := a.checkOrigin(&cr)
		if cr.hasOrigin && originErr == nil {
			hdr := w.Header()
			hdr.Set("Access-Control-Allow-Origin", cr.origin)
			hdr.Add("Vary", "Origin")
			hdr.Set("Access-Control-Expose-Headers", "Retry-After")
		}
		// The source address is limited before anything is verified, so
		// a flood of bad tokens costs little; the identity after.
		if !a.allowAPI(w, a.byAddr, "address", clientAddress(r, a.cfg.TrustedProxies)) {
			return
		}
		if err == nil {
			err = originErr
		}
		var id identity
		if err == nil {
			id, err = a.authenticate(&cr)
		}
		if err != nil {
			writeError(w, httpStatus(err), errorCode(err), err.Error())
			return
		}
		if !a.allowAPI(w, a.byUser, "identity", id.userID) {
			return
		}
		if !a.ready() {
			writeError(w, http.StatusServiceUnavailable, "unavailable", "the gateway is not ready")
			return
		}
		if id.watch != nil {
			r = r.WithContext(authz.WithWatchList(r.Context(), id.watch))
		}
		h(w, r, id)
	}
}

// allowAPI takes a token of key's bucket in l, or answers 429 with
// Retry-After (whole seconds, at least 1) and reports false. by names the
// limit, "identity" (key is a user id) or "address", in the metrics and
// the message.
func (a *api) allowAPI(w http.ResponseWriter, l *keyrate.Limiter, by, key string) bool {
	return allowRate(w, l, a.metrics, by, key)
}

// allowRate takes a token of key's bucket in l, or answers 429 with
// Retry-After (whole seconds, at least 1) and reports false. by names the
// limit in the metrics and the message: "identity" (key is a user id),
// "key" (an API key's name) or "address".
func allowRate(w http.ResponseWriter, l *keyrate.Limiter, m *gatewayMetrics, by, key string) bool {
	ok, wait := l.Allow(key, time.Now())
	if ok {
		return true
	}
	who := "this address"
	switch by {
	case "identity":
		who = "user " + key
	case "key":
		who = "key " + key
	}
	m.apiLimited.WithLabelValues(by).Inc()
	secs := max(1, int((wait+time.Second-1)/time.Second))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, http.StatusTooManyRequests, protocol.CodeRateLimited,
		fmt.Sprintf("too many API requests from %s; retry after %ds", who, secs))
	return false
}

// preflight answers CORS preflight requests for the API.
func (a *api) preflight(w http.ResponseWriter, r *http.Request) {
	cr, _ := credentialsFromHTTP(r)
	if !cr.hasOrigin || a.checkOrigin(&cr) != nil {
		writeError(w, http.StatusForbidden, "forbidden_origin", "origin not allowed")
		return
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", cr.origin)
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
}

// otherMethod answers a request to an API path that takes method with
// another one: a preflight, or 405 naming the methods the path takes.
func (a *api) otherMethod(method string) http.HandlerFunc {
	allow := method + ", OPTIONS"
	if method == http.MethodGet {
		allow = "GET, HEAD, OPTIONS"
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions {
			a.preflight(w, r)
			return
		}
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed",
			fmt.Sprintf("%s takes %s, not %s", r.URL.Path, method, r.Method))
	}
}

// appUnavailableHTTP answers a request the app did not answer about.
func appUnavailableHTTP(w http.ResponseWriter) {
	writeError(w, http.StatusServiceUnavailable, protocol.ReasonAuthorizationUnavailable,
		"the app did not answer whether this may be watched; try again")
}

// unavailable answers a request whose NATS work failed.
func (a *api) unavailable(w http.ResponseWriter, err error) {
	a.log.Warn("api request failed", "err", err)
	writeError(w, http.StatusServiceUnavailable, "unavailable", "presence state is unavailable right now; try again")
}

// visiblePresence reads target's presence as watcher may see it, or the
// reason watcher may not.
func (a *api) visiblePresence(ctx context.Context, watcher, target string) (presence.Presence, string, error) {
	if !presence.ValidUserID(target) {
		return presence.Presence{}, protocol.ReasonInvalidUserID, nil
	}
	d, err := a.authz.Decide(ctx, watcher, target)
	if err != nil {
		return presence.Presence{}, "", err
	}
	if !d.Allowed {
		return presence.Presence{}, d.Reason, nil
	}
	ps, err := a.readPresence(ctx, []hub.Grant{{User: target, LastSeen: d.LastSeen}})
	if err != nil {
		return presence.Presence{}, "", err
	}
	return ps[0], "", nil
}

// readPresence reads the presence of the granted users in parallel, as
// their grants let the caller see it.
func (a *api) readPresence(ctx context.Context, grants []hub.Grant) ([]presence.Presence, error) {
	return readPresences(ctx, a.presenceOf, grants)
}

// readPresences reads the presence of each grant's user with presenceOf,
// readConcurrency at once, its last_seen only where the grant lets it be
// seen.
func readPresences(ctx context.Context, presenceOf func(context.Context, string) (presence.Presence, uint64, int64, error), grants []hub.Grant) ([]presence.Presence, error) {
	out := make([]presence.Presence, len(grants))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, gr := range grants {
		g.Go(func() error {
			p, _, _, err := presenceOf(gctx, gr.User)
			if !gr.LastSeen {
				p.LastSeen = 0
			}
			out[i] = p
			return err
		})
	}
	return out, g.Wait()
}

// getUser answers GET /api/presence/users/{id}.
func (a *api) getUser(w http.ResponseWriter, r *http.Request, id identity) {
	target := r.PathValue("id")
	p, reason, err := a.visiblePresence(r.Context(), id.userID, target)
	switch {
	case err != nil:
		a.unavailable(w, err)
	case reason == protocol.ReasonAuthorizationUnavailable:
		appUnavailableHTTP(w)
	case reason == protocol.ReasonInvalidUserID:
		writeError(w, http.StatusBadRequest, reason, fmt.Sprintf("user ids are 1 to %d characters of A-Z a-z 0-9 _ -", presence.MaxUserIDLen))
	case reason != "":
		writeError(w, http.StatusForbidden, reason, fmt.Sprintf("%s may not watch %s (%s)", id.userID, target, denialText(reason)))
	default:
		writeJSON(w, http.StatusOK, p)
	}
}

// getRoom answers GET /api/rooms/{room}: the room's members, as a
// room_state would show them, to whoever may join the room.
func (a *api) getRoom(w http.ResponseWriter, r *http.Request, id identity) {
	roomID := r.PathValue("room")
	switch {
	case !presence.ValidRoomID(roomID):
		writeError(w, http.StatusBadRequest, protocol.ReasonInvalidRoom,
			fmt.Sprintf("room ids are 1 to %d characters of A-Z a-z 0-9 _ - and :", presence.MaxRoomIDLen))
		return
	case !id.rooms.allows(roomID):
		writeError(w, http.StatusForbidden, protocol.ReasonNotAllowed, fmt.Sprintf("%s may not see room %s (the token's rooms claim does not name it)", id.userID, roomID))
		return
	}
	entries, err := a.store.RoomMembers(r.Context(), roomID)
	if err != nil {
		a.unavailable(w, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotOf(roomID, entries, a.cfg.RoomMembersMax))
}

// denialText says what a denial reason means.
func denialText(reason string) string {
	switch reason {
	case protocol.ReasonNotMutualFollowers:
		return "they do not both follow each other"
	case protocol.ReasonNotFollowing:
		return "the watcher does not follow the target"
	case protocol.ReasonNotAllowed:
		return "the policy does not allow it"
	case protocol.ReasonAuthorizationUnavailable:
		return "the app did not answer"
	}
	return reason
}

// queryRequest is the body of POST /api/presence/query.
type queryRequest struct {
	UserIDs idList `json:"user_ids"`
}

// idList is a list of ids that knows whether it was given: null is an
// empty list (as Go encodes a nil slice), a missing field none at all.
type idList struct {
	ids   []string
	given bool
}

func (l *idList) UnmarshalJSON(b []byte) error {
	l.given = true
	return json.Unmarshal(b, &l.ids)
}

// queryResponse answers POST /api/presence/query.
type queryResponse struct {
	Users  []presence.Presence `json:"users"`
	Denied []deniedEntry       `json:"denied"`
}

type deniedEntry struct {
	UserID string `json:"user_id"`
	Reason string `json:"reason"`
}

// query answers POST /api/presence/query.
func (a *api) query(w http.ResponseWriter, r *http.Request, id identity) {
	var req queryRequest
	// 64 KiB, or what MaxQueryIDs of the longest ids take, with room for
	// spaces between them.
	limit := max(64<<10, a.cfg.MaxQueryIDs*(presence.MaxUserIDLen+8))
	body := http.MaxBytesReader(w, r.Body, int64(limit))
	dec := json.NewDecoder(body)
	if err := dec.Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "bad_request", fmt.Sprintf("body over %d KiB", (limit+1023)>>10))
			return
		}
		writeError(w, http.StatusBadRequest, "bad_request", `body must be {"user_ids": ["...", ...]}`)
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, "bad_request", "body must hold one JSON object")
		return
	}
	if !req.UserIDs.given {
		// A misspelt field is no query about nobody.
		writeError(w, http.StatusBadRequest, "bad_request", `body must be {"user_ids": ["...", ...]}: "user_ids" is missing`)
		return
	}
	if len(req.UserIDs.ids) > a.cfg.MaxQueryIDs {
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("at most %d user ids per query", a.cfg.MaxQueryIDs))
		return
	}
	resp := queryResponse{Users: []presence.Presence{}, Denied: []deniedEntry{}}
	var valid []string
	seen := make(map[string]bool, len(req.UserIDs.ids))
	for _, u := range req.UserIDs.ids {
		if seen[u] {
			continue
		}
		seen[u] = true
		if !presence.ValidUserID(u) {
			resp.Denied = append(resp.Denied, deniedEntry{u, protocol.ReasonInvalidUserID})
			continue
		}
		valid = append(valid, u)
	}
	ctx := r.Context()
	decisions, err := a.authz.DecideAll(ctx, id.userID, valid)
	if err != nil {
		a.unavailable(w, err)
		return
	}
	var grants []hub.Grant
	for i, d := range decisions {
		if d.Reason == protocol.ReasonAuthorizationUnavailable {
			appUnavailableHTTP(w)
			return
		}
		if !d.Allowed {
			resp.Denied = append(resp.Denied, deniedEntry{valid[i], d.Reason})
			continue
		}
		grants = append(grants, hub.Grant{User: valid[i], LastSeen: d.LastSeen})
	}
	users, err := a.readPresence(ctx, grants)
	if err != nil {
		a.unavailable(w, err)
		return
	}
	resp.Users = append(resp.Users, users...)
	writeJSON(w, http.StatusOK, resp)
}

// limitParam reads ?limit=, between 1 and max; def when absent.
func limitParam(r *http.Request, def, max int) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > max {
		return 0, fmt.Errorf("limit must be a number from 1 to %d", max)
	}
	return n, nil
}

// getOnline answers GET /api/presence/online (global presence).
func (a *api) getOnline(w http.ResponseWriter, r *http.Request, id identity) {
	if !a.authz.Everyone() {
		writeError(w, http.StatusForbidden, protocol.ReasonNotAllowed, "global presence needs the everyone policy")
		return
	}
	limit, err := limitParam(r, a.cfg.OnlineLimit, a.cfg.OnlineLimit)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	users, count, err := a.online.list(limit)
	if err != nil {
		a.unavailable(w, err)
		return
	}
	hideLastSeen(users, a.authz.LastSeenOf(r.Context(), id.userID, userIDs(users)))
	writeJSON(w, http.StatusOK, struct {
		Count int                 `json:"count"`
		Users []presence.Presence `json:"users"`
	}{count, users})
}

// getFriends answers GET /api/presence/friends: the caller's mutual
// followers, online first, then by last_seen, newest first.
func (a *api) getFriends(w http.ResponseWriter, r *http.Request, id identity) {
	limit, err := limitParam(r, 50, 500)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	grants, err := a.authz.Friends(r.Context(), id.userID, maxFriends)
	if errors.Is(err, authz.ErrAppUnavailable) {
		a.log.Warn("friends list", "user_id", id.userID, "err", err)
		appUnavailableHTTP(w)
		return
	}
	if err != nil {
		a.unavailable(w, err)
		return
	}
	friends, err := a.readPresence(r.Context(), grants)
	if err != nil {
		a.unavailable(w, err)
		return
	}
	sort.SliceStable(friends, func(i, j int) bool {
		a, b := friends[i], friends[j]
		if av, bv := a.Status.Visible(), b.Status.Visible(); av != bv {
			return av
		}
		if a.LastSeen != b.LastSeen {
			return a.LastSeen > b.LastSeen
		}
		return a.UserID < b.UserID
	})
	if len(friends) > limit {
		friends = friends[:limit]
	}
	writeJSON(w, http.StatusOK, struct {
		Friends []presence.Presence `json:"friends"`
	}{friends})
}
