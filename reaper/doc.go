// Package reaper turns ended connections into offline and inactive ones
// into away.
//
// A reaper consumes presence_conns through the durable consumer "reaper",
// shared by every reaper instance: each message goes to one instance and is
// delivered again if that instance dies before acknowledging it.
//
//   - A removal marker for "<user>.<conn>" (the key expired because its
//     gateway stopped refreshing it, the offline grace of a clean close ended,
//     or the key was purged) removes the connection from the user's status
//     record. Removing the last one makes the user offline. The removal is a
//     compare-and-set, and applies only when the record's connection was
//     created before the marker: a connection its gateway created again
//     after an expiry race is left alone.
//   - Every write of a connection key carries away_at, the moment the
//     connection counts as inactive unless it is written again. The reaper
//     keeps one timer per connection; when it fires, it reads the status
//     record, then the connection key from the stream leader, and marks the
//     connection idle by compare-and-set only if the key still says so. When
//     every connection of a user is idle, the user is away.
//
// A periodic sweep (and one at start) repairs what events cannot: it reads
// every status record, then lists every live connection key, and removes
// connections whose keys are gone (their markers may have aged out while no
// reaper ran), and reschedules inactivity timers. A reaper is ready only
// once its sweep at start has finished.
package reaper
