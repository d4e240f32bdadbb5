package freeport

import (
	"errors"
	"net"
	"strconv"
	"testing"
)

// TestPort: the ports given are free, below the ephemeral range, and
// never the same twice.
func TestPort(t *testing.T) {
	seen := make(map[int]bool)
	for range 50 {
		p, err := Port()
		if err != nil {
			t.Fatal(err)
		}
		if p < low || p >= low+span {
			t.Fatalf("port %d outside [%d, %d)", p, low, low+span)
		}
		if seen[p] {
			t.Fatalf("port %d given twice", p)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("listen on the port given: %v", err)
		}
		_ = ln.Close()
	}
}

// TestPortTaken: a port something listens on, or one given before, is
// passed over for the next.
func TestPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().(*net.TCPAddr).Port
	before, err := Port()
	if err != nil {
		t.Fatal(err)
	}
	free, err := Port() // given once, and closed: free again
	if err != nil {
		t.Fatal(err)
	}
	delete(given, free)
	queue := []int{busy, before, free}
	defer func(c func() int) { candidate = c }(candidate)
	candidate = func() int {
		p := queue[0]
		if len(queue) > 1 {
			queue = queue[1:]
		}
		return p
	}
	if p, err := Port(); err != nil || p != free {
		t.Fatalf("Port() = %d, %v; want %d, past %d (listened on) and %d (given before)", p, err, free, busy, before)
	}
	// Nothing left but a port given before: no port.
	if p, err := Port(); !errors.Is(err, ErrNoPort) {
		t.Fatalf("Port() = %d, %v; want ErrNoPort", p, err)
	}
}

func TestAddr(t *testing.T) {
	addr, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" || port == "" {
		t.Fatalf("Addr() = %q, %v", addr, err)
	}
}
