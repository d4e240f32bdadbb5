// Package fanout makes sure every status change is published.
//
// The events of a status revision are a public Event on
// presence.event.<user> when what others see of the user changed
// (invisible looks offline), and a SelfEvent on presence.gw.<gateway>.self
// for each gateway holding one of the user's connections when the user's
// true status or device count changed (presence.Changes says which). NATS
// interest routing carries an event only to gateways with a socket
// watching the user. The process that writes a revision may publish its
// events itself, right after its write (presence.Publish), so that a
// change reaches its watchers in one hop.
//
// A writer that does not (or that dies between its write and its publish,
// or loses its NATS connection with the events in its buffer) is what the
// fanout is for: it consumes every revision of presence_status through the
// durable consumer "fanout", shared by all fanout instances (each revision
// goes to one of them, again if it dies before acknowledging it), and
// listens to the events writers publish. Delay after a revision was written, it
// publishes the events the revision calls for that it did not see
// published, and acknowledges the revision. Where every writer publishes,
// it publishes nothing in a healthy system.
//
// Records carry version counters (pv, sv) that their writers bump on every
// change, so a fanout that skipped revisions (History keeps a few) or
// restarted still knows what moved. A fanout skips a revision no newer
// than one it already handled for the user (delivered again after a lost
// acknowledgement), and gateways drop events whose revision is not newer
// than what they have, so duplicates are harmless.
package fanout
