// Package outbox holds what waits to be written to a gateway's sockets and
// decides when it is written.
//
// A Box holds, for one socket, the newest change of each user the socket
// watches and the newest state of the socket's own user: a socket that
// cannot keep up never holds more than one entry per watched user. A
// Scheduler writes boxes through their Flusher, pacing each socket at one
// frame per batch interval with a burst: a socket whose changes come no
// faster than that gets each at once, and one that gets them faster gets
// its next frame a batch interval after the last, its changes coalescing
// meanwhile. No clock ticks when nothing changes.
package outbox
