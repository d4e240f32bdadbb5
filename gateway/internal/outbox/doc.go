// Package outbox holds what waits to be written to a gateway's sockets and
// decides when it is written.
//
// A Box holds, for one socket, the newest change of each user the socket
// watches and the newest state of the socket's own user: a socket that
// cannot keep up never holds more than one entry per watched user. A
// Scheduler writes boxes through their Flusher: frames to one socket at
// least a batch interval apart, and, while its changes keep coming, one
// per pace after a short burst; a socket whose changes come no faster
// than the pace gets each at once, and the changes of one that waits
// coalesce meanwhile. No clock ticks when nothing changes.
package outbox
