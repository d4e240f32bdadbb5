package bench

// ReadWithGoroutines makes the workers run in this process read each
// socket with a goroutine of its own, as where there is no poller, until
// the function it returns is called.
func ReadWithGoroutines() (restore func()) {
	noPollSockets.Store(true)
	return func() { noPollSockets.Store(false) }
}
