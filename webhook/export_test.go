package webhook

// SetMaxResync sets how many users of dead-lettered batches the processes
// made after it remember, and returns a function that restores it.
func SetMaxResync(n int) (restore func()) {
	was := maxResync
	maxResync = n
	return func() { maxResync = was }
}

// RetryWait is retryWait: the wait before the next attempt.
var RetryWait = retryWait
