// Package fanout makes sure every status change is published.
//
// The process that writes a status revision (a gateway, or a reaper)
// publishes its events itself, right after its write: a public Event on
// presence.event.<user> when what others see of the user changed
// (invisible looks offline), and a SelfEvent on presence.gw.<gateway>.self
// for each gateway holding one of the user's connections when the user's
// true status or device count changed (presence.Changes says which). NATS
// interest routing carries an event only to gateways with a socket
// watching the user: a change reaches its watchers in one hop.
//
// A writer can die between its write and its publish, or lose its NATS
// connection with the events in its buffer. The fanout is the safety net:
// it consumes every revision of presence_status through the durable
// consumer "fanout", shared by all fanout instances (each revision goes to
// one of them, again if it dies before acknowledging it), read in batches,
// and reads the writers' reports of the events they published
// (presence.Published on presence.published, from each writer at most
// every 50ms while it publishes). Delay after a revision was written, it
// publishes the events the revision calls for that no report named, and
// acknowledges the revision. In a healthy system it publishes nothing.
//
// Records carry version counters (pv, sv) that their writers bump on every
// change, so a fanout that skipped revisions (History keeps a few) or
// restarted still knows what moved; and a record that left the public
// view as it was says since which revision (ps), so an instance that did
// not handle that one publishes no event repeating it. The versions are
// all the fanout decodes of a revision whose events the writer's report
// covers; the whole record only when it publishes. A revision no newer
// than one a fanout already handled for the user was delivered again after
// a lost acknowledgement, which its events may have been lost with (a
// connection that died with both in flight): the fanout publishes them
// again, unless the server confirmed it has them, or a newer revision's
// (a ping answered on the connection they went out on, after each batch
// that published something). Gateways drop events whose revision is not
// newer than what they have, so duplicates are harmless.
package fanout
