package bench

import "errors"

// ErrInvalidConfig wraps every reason a Config or Layout cannot be run.
var ErrInvalidConfig = errors.New("invalid bench configuration")

// ErrWorker wraps a failure reported by, or seen in, a worker.
var ErrWorker = errors.New("bench worker failed")

// ErrSystem wraps a failure of the system under test: a NATS server,
// gateway, reaper or fanout that would not start or stopped.
var ErrSystem = errors.New("system under test failed")
