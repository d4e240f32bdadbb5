// Package outbox holds what waits to be written to a gateway's sockets and
// decides when it is written.
//
// A Box holds, for one socket, the newest change of each user the socket
// watches and the newest state of the socket's own user: a socket that
// cannot keep up never holds more than one entry per watched user. A
// Scheduler writes boxes through their Flusher: a socket that was not
// written to for a batch interval gets a change at once, and one written
// to more recently gets its next frame a batch interval after the last,
// its changes coalescing meanwhile. No clock ticks when nothing changes.
package outbox
