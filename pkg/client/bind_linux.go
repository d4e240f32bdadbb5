//go:build linux

package client

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// bindNoPort lets the kernel choose the local port of a socket bound to a
// source address at connect rather than at bind. Chosen at bind, a port
// must be free for every destination, and with tens of thousands of
// sockets on the address the kernel searches its whole port range for one
// on every dial; chosen at connect, it need only make the four-tuple
// unique. Should the option be refused, the dial goes on the usual way.
func bindNoPort(_, _ string, rc syscall.RawConn) error {
	return rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	})
}
