// Package reaper ends the connections of gateways that are gone.
//
// Every gateway holds a lease in presence_leases, refreshed about every
// second, and registers each of its connections under it. A gateway ends
// its own connections (a close, after the offline grace; a silent client,
// after the TTL); what it cannot end is what dies with it. When its lease
// ends (it expired: the gateway died, or lost NATS for longer than the
// lease TTL; or it was deleted), a reaper takes every connection held
// under that lease out of its user's status record, by compare-and-set,
// and removes their keys, which one subject filter names. Removing a
// user's last connection makes them offline, and the reaper publishes the
// events of its writes at once, as every writer does.
//
// A reaper consumes presence_leases through the durable consumer "reaper",
// shared by every reaper instance: each lease's end goes to one instance
// and is delivered again if that instance dies before it is applied. The
// markers of ended leases are kept for a day, so a reaper that was down
// catches up from its consumer.
//
// Keys of the earlier shape, "<user>.<conn>", which gateways kept alive
// with TTL refreshes, still end their connection when they expire or are
// removed (a second consumer, on presence_conns, sees only them): a
// deployment can be upgraded in place.
//
// The sweep at start (and on request, or every SweepInterval when set)
// repairs what no lease end it saw did: connections held under a lease
// that is over, and connections of the earlier shape whose key is gone. A
// reaper is ready only once its sweep at start has finished.
package reaper
