package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/greendot/greendot/gateway/internal/authz"
	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/presence"
)

// TokenVerifier verifies bearer tokens. Implementations must be safe for
// concurrent use.
type TokenVerifier interface {
	// Verify returns the user id a token proves and when the proof expires.
	// It returns an error for a token that is malformed, badly signed,
	// expired or otherwise not acceptable.
	Verify(token string) (userID string, expires time.Time, err error)
}

// KeyRefresher is a TokenVerifier whose keys are read again as they
// change (pkg/auth's Verifier over a key set is one): the gateway runs
// RefreshKeys for as long as it serves. WaitsForKeys reports whether
// verifying a token may first wait for such a read (its key is one the
// keys lack): a socket's token renewal that may is verified off the
// goroutine that reads the gateway's sockets.
type KeyRefresher interface {
	TokenVerifier
	RefreshKeys(ctx context.Context)
	WaitsForKeys(token string) bool
}

// WatchVerifier is a TokenVerifier that also reads a token's watch claim:
// the user ids its subject may watch under PolicyToken (nil when the token
// has none). pkg/auth's Verifier is one.
type WatchVerifier interface {
	TokenVerifier
	VerifyWatch(token string) (userID string, expires time.Time, watch []string, err error)
}

// credentials is what a request says about who sent it.
type credentials struct {
	bearer    string // Authorization: Bearer <token>
	token     string // ?token=
	user      string // ?user= (dev auth)
	device    string // ?device=
	hasDevice bool
	// platform is ?platform=.
	platform    string
	hasPlatform bool
	origin      string
	hasOrigin   bool
	// origins counts the Origin headers: a request with more is refused.
	origins int
	// askProxy says an upgrade without a token is asked of the connect
	// proxy, with the headers forwarded (connectProxy.forward).
	askProxy  bool
	forwarded map[string]string
	// proxied is set once the connect proxy let the client in (askProxy),
	// with the session value and lifetime of its answer.
	proxied  bool
	session  string
	lifetime time.Duration
}

// identity is a verified client.
type identity struct {
	userID   string
	device   string
	platform presence.PlatformCode
	// expires is when the token proving it expires; zero for dev auth.
	expires time.Time
	// watch is the token's watch claim, under PolicyToken.
	watch *authz.WatchList
	// rooms are the rooms it may join.
	rooms *roomGrant
	// proxied is set for a client that sent no token, to be asked of the
	// connect proxy (askProxy).
	proxied bool
}

// parseQuery fills the query parts of cr from a request URI's raw query.
func (cr *credentials) parseQuery(rawQuery string) error {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return fmt.Errorf("%w: malformed query string", ErrBadRequest)
	}
	cr.token = q.Get("token")
	cr.user = q.Get("user")
	cr.device, cr.hasDevice = q.Get("device"), q.Has("device")
	cr.platform, cr.hasPlatform = q.Get("platform"), q.Has("platform")
	return nil
}

// setHeader records a request header that matters for authentication.
func (cr *credentials) setHeader(key, value string) {
	switch {
	case strings.EqualFold(key, "Authorization"):
		if scheme, tok, ok := strings.Cut(value, " "); ok && strings.EqualFold(scheme, "Bearer") {
			cr.bearer = strings.TrimSpace(tok)
		} else {
			cr.bearer = "\x00invalid" // a scheme we do not take fails verification
		}
	case strings.EqualFold(key, "Origin"):
		cr.origin, cr.hasOrigin = value, true
		cr.origins++
	}
}

// credentialsFromHTTP reads the credentials of an HTTP API request. With
// a malformed query string it returns an error, and the headers read.
func credentialsFromHTTP(r *http.Request) (credentials, error) {
	var cr credentials
	if h := r.Header.Get("Authorization"); h != "" {
		cr.setHeader("Authorization", h)
	}
	for _, o := range r.Header.Values("Origin") {
		cr.setHeader("Origin", o)
	}
	return cr, cr.parseQuery(r.URL.RawQuery)
}

// authenticate turns credentials into an identity. A token, when one is
// given, must verify; ?user= is taken only with dev auth; an upgrade with
// neither, under a connect proxy, is left to it (id.proxied).
func (s *Service) authenticate(cr *credentials) (identity, error) {
	var id identity
	if cr.hasDevice {
		if !presence.ValidDevice(cr.device) {
			return id, fmt.Errorf("%w: device must be 1 to %d characters of A-Z a-z 0-9 _ - . and space", ErrBadRequest, presence.MaxDeviceLen)
		}
		id.device = cr.device
	}
	if cr.hasPlatform {
		if !presence.ValidPlatform(cr.platform) {
			return id, fmt.Errorf("%w: platform must be web, desktop or mobile", ErrBadRequest)
		}
		id.platform = presence.Platform(cr.platform).Code()
	}
	token := cr.bearer
	if token == "" {
		token = cr.token
	}
	switch {
	case token != "":
		if s.cfg.Tokens == nil {
			return id, fmt.Errorf("%w: this gateway accepts no tokens", ErrUnauthorized)
		}
		userID, exp, watch, err := s.verify(token)
		if err != nil {
			return id, err
		}
		if !presence.ValidUserID(userID) {
			return id, fmt.Errorf("%w: token subject is not a valid user id", ErrUnauthorized)
		}
		rooms, err := s.verifyRooms(token)
		if err != nil {
			return id, err
		}
		id.userID, id.expires, id.watch, id.rooms = userID, exp, watch, rooms
	case cr.user != "":
		if !s.cfg.DevAuth {
			return id, fmt.Errorf("%w: ?user= needs dev auth, which is off; send a token", ErrUnauthorized)
		}
		if !presence.ValidUserID(cr.user) {
			return id, fmt.Errorf("%w: user id must be 1 to %d characters of A-Z a-z 0-9 _ -", ErrBadRequest, presence.MaxUserIDLen)
		}
		id.userID, id.rooms = cr.user, allRooms
	case cr.askProxy:
		id.proxied = true
	default:
		if s.cfg.DevAuth {
			return id, fmt.Errorf("%w: missing identity: send a token, or ?user=<id> (dev auth)", ErrUnauthorized)
		}
		return id, fmt.Errorf("%w: missing token: send Authorization: Bearer <JWT> or ?token=<JWT>", ErrUnauthorized)
	}
	return id, nil
}

// checkOrigin refuses a browser request from an Origin that is not allowed,
// and one with more than one Origin (which one would be the page's?).
// Requests without an Origin (not from a browser) pass.
func (s *Service) checkOrigin(cr *credentials) error {
	if cr.origins > 1 {
		return fmt.Errorf("%w: %d Origin headers, want one", ErrBadRequest, cr.origins)
	}
	if !cr.hasOrigin || len(s.cfg.AllowedOrigins) == 0 {
		return nil
	}
	for _, o := range s.cfg.AllowedOrigins {
		if o == "*" || strings.EqualFold(o, cr.origin) {
			return nil
		}
	}
	return fmt.Errorf("%w: %q", ErrForbiddenOrigin, cr.origin)
}

// verify verifies a token, and under PolicyToken reads its watch claim,
// which must hold at most TokenMaxWatch user ids. Every error wraps
// ErrUnauthorized.
func (s *Service) verify(token string) (string, time.Time, *authz.WatchList, error) {
	if s.cfg.Policy != PolicyToken {
		userID, exp, err := s.cfg.Tokens.Verify(token)
		if err != nil {
			return "", time.Time{}, nil, fmt.Errorf("%w: %v", ErrUnauthorized, err)
		}
		return userID, exp, nil, nil
	}
	userID, exp, watch, err := s.cfg.Tokens.(WatchVerifier).VerifyWatch(token)
	if errors.Is(err, auth.ErrWatchClaim) {
		return "", time.Time{}, nil, fmt.Errorf("%w: %v; %s", ErrUnauthorized, err, s.watchLimit())
	}
	if err != nil {
		return "", time.Time{}, nil, fmt.Errorf("%w: %v", ErrUnauthorized, err)
	}
	if len(watch) > s.cfg.TokenMaxWatch {
		return "", time.Time{}, nil, fmt.Errorf("%w: the token's watch claim lists %d user ids, over the limit: %s",
			ErrUnauthorized, len(watch), s.watchLimit())
	}
	return userID, exp, authz.NewWatchList(watch), nil
}

// verifyRooms reads the rooms claim of a token that verified: the rooms
// it allows (none with a TokenVerifier that reads no rooms claim). A
// claim that is not a list of room ids and prefixes refuses the token.
// It wraps ErrUnauthorized.
func (s *Service) verifyRooms(token string) (*roomGrant, error) {
	rv, ok := s.cfg.Tokens.(RoomsVerifier)
	if !ok {
		return newRoomGrant(nil), nil
	}
	_, _, rooms, err := rv.VerifyRooms(token)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnauthorized, err)
	}
	return newRoomGrant(rooms), nil
}

// watchLimit says what a token's watch claim may hold, and what to do
// beyond it.
func (s *Service) watchLimit() string {
	return fmt.Sprintf("a watch claim lists at most %d user ids (--token-watch-max); "+
		"for bigger lists let the gateway ask the app (policy app)", s.cfg.TokenMaxWatch)
}
