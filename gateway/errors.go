package gateway

import (
	"errors"
	"net/http"
)

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("gateway: invalid config")

// ErrUnauthorized means a request carries no identity, or one that cannot
// be verified (a bad or expired token, dev auth while it is off).
var ErrUnauthorized = errors.New("unauthorized")

// ErrForbiddenOrigin means a browser connected from an Origin that is not
// allowed.
var ErrForbiddenOrigin = errors.New("origin not allowed")

// ErrForbiddenHost means a request under dev auth named a host (Host)
// that is not this machine's: a web page whose name was made to point here
// (DNS rebinding).
var ErrForbiddenHost = errors.New("host not allowed")

// ErrUnavailable means the gateway cannot take the request now: it is full,
// draining, or cannot reach NATS.
var ErrUnavailable = errors.New("unavailable")

// ErrBadRequest means a request is malformed: a bad user id, device label or
// body.
var ErrBadRequest = errors.New("bad request")

// ErrTooManyConns means a user already has as many connections on this
// gateway as allowed.
var ErrTooManyConns = errors.New("too many connections for this user")

// httpStatus maps an error of this package to the HTTP status that answers
// it.
func httpStatus(err error) int {
	switch {
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, ErrForbiddenOrigin), errors.Is(err, ErrForbiddenHost):
		return http.StatusForbidden
	case errors.Is(err, ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, ErrTooManyConns):
		return http.StatusTooManyRequests
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// errorCode maps an error of this package to the "error" code of a JSON
// error answer.
func errorCode(err error) string {
	switch {
	case errors.Is(err, ErrUnauthorized):
		return "unauthorized"
	case errors.Is(err, ErrForbiddenOrigin):
		return "forbidden_origin"
	case errors.Is(err, ErrForbiddenHost):
		return "forbidden_host"
	case errors.Is(err, ErrBadRequest):
		return "bad_request"
	case errors.Is(err, ErrTooManyConns):
		return "too_many_connections"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	default:
		return "internal"
	}
}
