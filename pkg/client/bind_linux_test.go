//go:build linux

package client_test

import (
	"context"
	"net"
	"testing"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"golang.org/x/sys/unix"

	"github.com/greendot/greendot/pkg/client"
)

// TestDialFromSourceAddressDefersThePort dials a WebSocket server from
// 127.0.0.2 and checks that the socket left the choice of its local port
// to connect (IP_BIND_ADDRESS_NO_PORT), which keeps dials cheap when tens
// of thousands of sockets share the source address.
func TestDialFromSourceAddressDefersThePort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer nc.Close()
		if _, err := ws.Upgrade(nc); err != nil {
			served <- err
			return
		}
		if err := wsutil.WriteServerText(nc, []byte(`{"type":"hello","user_id":"alice"}`)); err != nil {
			served <- err
			return
		}
		// Hold the socket until the client is done with it.
		_, _, _ = wsutil.ReadClientData(nc)
		served <- nil
	}()
	src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}
	c, err := client.Dial(context.Background(), "ws://"+ln.Addr().String()+"/ws", client.Options{LocalAddr: src})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.Close()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	if got := c.NetConn().LocalAddr().(*net.TCPAddr); !got.IP.Equal(src.IP) || got.Port == 0 {
		t.Fatalf("local address %v, want 127.0.0.2 and a port", got)
	}
	rc, err := c.NetConn().(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT)
	}); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	if v != 1 {
		t.Fatalf("IP_BIND_ADDRESS_NO_PORT = %d, want 1", v)
	}
}
