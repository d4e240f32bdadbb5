//go:build !linux

package bench

import (
	"errors"
	"net"
)

// errEOF is readSocket's end of the stream.
var errEOF = errors.New("EOF")

// readSocket is not used where there is no poller.
func readSocket(uintptr, []byte) (int, error) {
	return 0, errors.New("bench: no poller on this platform")
}

// setLingerZero makes closing nc reset it, leaving no TIME_WAIT.
func setLingerZero(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}
