//go:build !linux

package client

import "syscall"

// bindNoPort is Linux's IP_BIND_ADDRESS_NO_PORT; elsewhere the port is
// chosen at bind.
var bindNoPort func(network, address string, rc syscall.RawConn) error
