//go:build !linux

package bench

import "net"

// setLingerZero makes closing nc reset it, leaving no TIME_WAIT.
func setLingerZero(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}
