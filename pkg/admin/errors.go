package admin

import (
	"errors"
	"fmt"
)

// ErrBadRequest means a request is malformed: not JSON, an unknown field,
// a bad user id or close code. Its micro error code is "400".
var ErrBadRequest = errors.New("bad request")

// ErrUnavailable means the process cannot answer now: it is starting,
// stopping, or cannot reach NATS or its buckets. Its micro error code is
// "503".
var ErrUnavailable = errors.New("unavailable")

// ErrNoReply means a request got no reply in time: no instance of the
// service runs, or none answered.
var ErrNoReply = errors.New("no reply")

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

// ServiceError is an error reply of an admin endpoint, as a client sees
// it. It matches ErrBadRequest or ErrUnavailable by its code.
type ServiceError struct {
	// Code is the micro error code ("400", "503", "500").
	Code string
	// Description is the error's text.
	Description string
	// Subject is the subject the request went to.
	Subject string
}

func (e *ServiceError) Error() string {
	return fmt.Sprintf("%s: error %s: %s", e.Subject, e.Code, e.Description)
}

// Is reports whether e is the sentinel its code stands for.
func (e *ServiceError) Is(target error) bool {
	switch e.Code {
	case CodeBadRequest:
		return target == ErrBadRequest
	case CodeUnavailable:
		return target == ErrUnavailable
	}
	return false
}
