// Package freeport finds a loopback TCP port for a server that another
// process starts, or that is started again later on the same address.
//
// Listening on port 0 and closing the listener finds a port that was free
// a moment ago, but in the kernel's ephemeral range, where every other
// port-0 listener and every outgoing connection takes its port too: on a
// busy machine another process can take it before the server binds it.
// The ports given here are below that range (32768 and up on Linux, 49152
// and up on macOS and Windows), and never the same twice in one process.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// The ports given are in [low, low+span).
const (
	low  = 20000
	span = 12000
	// tries bounds the ports looked at before giving up.
	tries = 200
)

// ErrNoPort is returned when no free port was found.
var ErrNoPort = errors.New("no free loopback port")

var (
	mu    sync.Mutex
	given = make(map[int]bool) // the ports returned by this process
	// candidate picks the next port to look at.
	candidate = func() int { return low + rand.IntN(span) }
)

// Port returns a port of 127.0.0.1 that was free a moment ago and that
// this process was not given before.
func Port() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range tries {
		p := candidate()
		if given[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		if err := ln.Close(); err != nil {
			return 0, fmt.Errorf("freeport: close %d: %w", p, err)
		}
		given[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("%w: %d ports from %d tried", ErrNoPort, tries, low)
}

// Addr returns Port as a "127.0.0.1:port" address.
func Addr() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}
