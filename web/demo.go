package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// maxDemoBody bounds the body of a demo endpoint request.
const maxDemoBody = 4 << 10

// maxDemoList bounds the follow lists the demo reads.
const maxDemoList = 500

// demoTimeout bounds the NATS work of one demo request.
const demoTimeout = 5 * time.Second

// demoAPI serves the demo's endpoints: the caller's follow graph, following
// and unfollowing, and the last_seen privacy setting. The caller is whoever
// ?user= says (dev auth): this exists only in demo mode.
type demoAPI struct {
	store *presence.Store
	log   *slog.Logger
	csrf  http.CrossOriginProtection
}

// graphAnswer answers GET /demo/api/graph.
type graphAnswer struct {
	UserID string `json:"user_id"`
	// Following lists whom the caller follows, and whether each follows
	// back (then they may watch each other under the mutual policy).
	Following []followed `json:"following"`
	// Followers lists who follows the caller.
	Followers []string `json:"followers"`
	// LastSeen is who may see the caller's last_seen.
	LastSeen presence.Visibility `json:"last_seen"`
}

type followed struct {
	UserID     string `json:"user_id"`
	FollowsYou bool   `json:"follows_you"`
}

// caller returns the user a demo request is from, or answers the request
// with an error and returns false.
func (d *demoAPI) caller(w http.ResponseWriter, r *http.Request) (string, bool) {
	user := r.URL.Query().Get("user")
	switch {
	case user == "":
		writeError(w, http.StatusUnauthorized, "unauthorized", "the demo API takes the caller from ?user=<id> (dev auth)")
		return "", false
	case !presence.ValidUserID(user):
		writeError(w, http.StatusBadRequest, "invalid_user_id", fmt.Sprintf("user ids are 1 to %d characters of A-Z a-z 0-9 _ -", presence.MaxUserIDLen))
		return "", false
	}
	return user, true
}

// decode reads a POST body of one JSON object into v, or answers the
// request with an error and returns false. A body must say it is JSON,
// which also keeps other sites' plain form posts out.
func (d *demoAPI) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := d.csrf.Check(r); err != nil {
		writeError(w, http.StatusForbidden, "forbidden_origin", err.Error())
		return false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "bad_request", "the body must be JSON (Content-Type: application/json)")
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxDemoBody))
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &mbe):
			writeError(w, http.StatusRequestEntityTooLarge, "bad_request", fmt.Sprintf("the body is over %d bytes", maxDemoBody))
		case errors.As(err, &te) && te.Field != "":
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("field %q has the wrong type", te.Field))
		default:
			writeError(w, http.StatusBadRequest, "bad_request", "the body must be one JSON object")
		}
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, "bad_request", "the body must be one JSON object")
		return false
	}
	return true
}

// target reads {"user_id": ...} and checks it names someone else.
func (d *demoAPI) target(w http.ResponseWriter, r *http.Request, me string, body *targetBody) bool {
	if !d.decode(w, r, body) {
		return false
	}
	switch {
	case !presence.ValidUserID(body.UserID):
		writeError(w, http.StatusBadRequest, "invalid_user_id", fmt.Sprintf(`"user_id" must be 1 to %d characters of A-Z a-z 0-9 _ -`, presence.MaxUserIDLen))
		return false
	case body.UserID == me:
		writeError(w, http.StatusBadRequest, "bad_request", "you always see yourself: follow someone else")
		return false
	}
	return true
}

type targetBody struct {
	UserID string `json:"user_id"`
	// Both also makes the target follow the caller (follow only).
	Both bool `json:"both"`
}

func (d *demoAPI) unavailable(w http.ResponseWriter, user string, err error) {
	d.log.Warn("demo request failed", "user_id", user, "err", err)
	writeError(w, http.StatusServiceUnavailable, "unavailable", "the graph is unavailable right now; try again")
}

// graph answers GET /demo/api/graph.
func (d *demoAPI) graph(w http.ResponseWriter, r *http.Request) {
	me, ok := d.caller(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), demoTimeout)
	defer cancel()
	following, err := d.store.Following(ctx, me)
	if err != nil {
		d.unavailable(w, me, err)
		return
	}
	followers, err := d.store.Followers(ctx, me)
	if err != nil {
		d.unavailable(w, me, err)
		return
	}
	settings, err := d.store.Settings(ctx, me)
	if err != nil {
		d.unavailable(w, me, err)
		return
	}
	slices.Sort(following)
	slices.Sort(followers)
	following = following[:min(len(following), maxDemoList)]
	followers = followers[:min(len(followers), maxDemoList)]
	ans := graphAnswer{UserID: me, Following: []followed{}, Followers: []string{}, LastSeen: settings.LastSeenVisibility()}
	for _, u := range following {
		if u != me {
			_, back := slices.BinarySearch(followers, u)
			ans.Following = append(ans.Following, followed{UserID: u, FollowsYou: back})
		}
	}
	for _, u := range followers {
		if u != me {
			ans.Followers = append(ans.Followers, u)
		}
	}
	writeJSON(w, http.StatusOK, ans)
}

// follow answers POST /demo/api/follow {"user_id": "bob", "both": true}.
func (d *demoAPI) follow(w http.ResponseWriter, r *http.Request) {
	me, ok := d.caller(w, r)
	var body targetBody
	if !ok || !d.target(w, r, me, &body) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), demoTimeout)
	defer cancel()
	if err := d.store.Follow(ctx, me, body.UserID); err != nil {
		d.unavailable(w, me, err)
		return
	}
	if body.Both {
		if err := d.store.Follow(ctx, body.UserID, me); err != nil {
			d.unavailable(w, me, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// unfollow answers POST /demo/api/unfollow {"user_id": "bob"}.
func (d *demoAPI) unfollow(w http.ResponseWriter, r *http.Request) {
	me, ok := d.caller(w, r)
	var body targetBody
	if !ok || !d.target(w, r, me, &body) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), demoTimeout)
	defer cancel()
	if err := d.store.Unfollow(ctx, me, body.UserID); err != nil {
		d.unavailable(w, me, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// privacy answers POST /demo/api/privacy {"last_seen": "everyone"}.
func (d *demoAPI) privacy(w http.ResponseWriter, r *http.Request) {
	me, ok := d.caller(w, r)
	if !ok {
		return
	}
	var body struct {
		LastSeen string `json:"last_seen"`
	}
	if !d.decode(w, r, &body) {
		return
	}
	v, err := presence.ParseVisibility(body.LastSeen)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", `"last_seen" must be everyone, contacts or nobody`)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), demoTimeout)
	defer cancel()
	if err := d.store.SetSettings(ctx, me, presence.Settings{LastSeen: v}); err != nil {
		d.unavailable(w, me, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
