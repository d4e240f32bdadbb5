// Package fanout turns status changes into presence events.
//
// A fanout consumes every revision of presence_status through the durable
// consumer "fanout", shared by all fanout instances: each revision goes to
// one of them, and is delivered again if that instance dies before
// acknowledging it. For each revision it publishes:
//
//   - an Event on presence.event.<user> when what others see of the user
//     (status, last_seen) changed. Invisible users look offline, and changes
//     nobody can see (a second device, an invisible user going idle) are
//     dropped. NATS interest routing carries the event only to gateways with
//     a socket watching the user.
//   - a SelfEvent on presence.gw.<gateway>.self, for each gateway holding one
//     of the user's connections, when the user's true status or device count
//     changed.
//
// Records carry version counters (pv, sv) that their writers bump on every
// such change, so a fanout that skipped revisions (History keeps a few) or
// restarted still knows what moved. A fanout skips a revision no newer
// than one it already handled for the user (delivered again after a lost
// acknowledgement), and gateways drop events whose revision is not newer
// than what they have, so duplicates from redelivery, or from several
// fanouts, are harmless.
package fanout
