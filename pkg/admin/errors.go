package admin

import "errors"

// ErrBadRequest means a request is malformed: not JSON, an unknown field,
// a bad user id or close code. Its micro error code is "400".
var ErrBadRequest = errors.New("bad request")

// ErrUnavailable means the process cannot answer now: it is starting,
// stopping, or cannot reach NATS or its buckets. Its micro error code is
// "503".
var ErrUnavailable = errors.New("unavailable")

// The micro error codes of admin replies.
const (
	CodeBadRequest  = "400"
	CodeUnavailable = "503"
	CodeInternal    = "500"
)

// errorCode maps a handler's error to its micro error code and the name
// in its JSON body.
func errorCode(err error) (code, name string) {
	switch {
	case errors.Is(err, ErrBadRequest):
		return CodeBadRequest, "bad_request"
	case errors.Is(err, ErrUnavailable):
		return CodeUnavailable, "unavailable"
	default:
		return CodeInternal, "internal"
	}
}
