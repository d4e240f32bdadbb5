// Package netpoll tells which of many sockets are readable (or writable
// again), so that a process (the gateway, the load generator's workers)
// can hold idle connections without a goroutine or a buffer each, and
// write to slow ones without waiting for them.
//
// On Linux it is a thin layer over epoll (golang.org/x/sys/unix): one
// epoll instance per Poller, one-shot (a descriptor is reported once, then
// again only after Resume), a 64-bit tag per file descriptor. Elsewhere
// Supported is false and its user falls back to a goroutine per
// connection.
package netpoll

import "errors"

// Event is a readiness event: the tag the descriptor was added with, and
// whether the peer hung up or the socket is in error.
type Event struct {
	Tag    uint64
	Hangup bool
}

// ErrClosed is returned by Wait after Close.
var ErrClosed = errors.New("netpoll: closed")
