package main

import (
	"net"
	"syscall"
	"testing"
)

// TestGatewayListenerNoKeepalive: the connections a gateway accepts get
// no TCP keepalive (the gateway finds silent clients itself), where a
// plain net.Listen's get it switched on, four socket options set at every
// accept.
func TestGatewayListenerNoKeepalive(t *testing.T) {
	t.Parallel()
	ln, err := listenGateway("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	raw, err := sc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var on int
	var gerr error
	if err := raw.Control(func(fd uintptr) { on, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if on != 0 {
		t.Errorf("SO_KEEPALIVE %d on an accepted connection, want 0", on)
	}
}
