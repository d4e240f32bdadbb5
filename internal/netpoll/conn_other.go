//go:build !linux

package netpoll

import (
	"errors"
	"net"
)

// Detach is not supported here: sockets stay with the runtime poller.
func Detach(net.Conn) (net.Conn, error) {
	return nil, errors.New("netpoll: not supported on this platform")
}
