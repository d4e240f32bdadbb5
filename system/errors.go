package system

import "errors"

// ErrStopped means a service or child process ended before it did what was
// waited for (being ready).
var ErrStopped = errors.New("stopped")

// ErrTimeout means a wait ran out of time: for a service to be ready or to
// return, for a process to exit, for NATS to start.
var ErrTimeout = errors.New("timed out")

// ErrNoModule means Build was called outside greendot's module, or without
// a go command.
var ErrNoModule = errors.New("cannot build greendot")
