//go:build !linux

package bench

// threadCPU reports that a thread's CPU time is not read here: the speed
// probe is off.
func threadCPU() (int64, bool) { return 0, false }
