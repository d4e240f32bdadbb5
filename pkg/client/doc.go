// Package client is the Go client of greendot's WebSocket protocol
// (docs/protocol.md), for Go services and tests that want to be presence
// clients. It has two layers.
//
// # Client: stays connected
//
// Connect returns a *Client, which takes care of the protocol's chores:
//
//   - It authenticates with a JWT (Config.Token, sent as Authorization:
//     Bearer, or Config.TokenFunc for a fresh one per connection), or with
//     ?user= on a gateway with dev auth (Config.User), and names the
//     device (Config.Device) and its platform (Config.Platform). With
//     Config.Compression it offers permessage-deflate, and inflates the
//     gateway's compressed frames transparently.
//   - With TokenFunc, it renews the token of the open connection in
//     place, so that the connection, its subscriptions and its rooms
//     outlive the token: when a third of the token's life is left (up to
//     its exp claim, read without verifying the signature), it calls
//     TokenFunc and sends the fresh token in an auth message. A call that
//     fails is tried again with backoff while the token lasts; if none
//     succeeds, the gateway closes the connection as expired and the
//     client opens a new one. SetToken sends a token got another way.
//   - It reads the hello frame and sends a heartbeat every
//     heartbeat_interval_ms the gateway asks for. A heartbeat only keeps
//     the connection alive: a person who sends no activity for 5 minutes
//     (by default) is made away automatically, so call Activity on use (on
//     every input event if need be: beyond one a heartbeat interval, the
//     activity goes with the next heartbeat, in its place) and Idle when
//     the person looks away, or set Config.KeepActive for a service that
//     is present while it runs. When the gateway sends nothing for longer
//     than its TTL (a ping is sent to probe it), the connection counts as
//     dead.
//   - Subscribe, Unsubscribe, SubscribeAll and UnsubscribeAll keep the set
//     of watched users; SetStatus keeps the chosen status. Both are sent at
//     once when a connection is open, and again on every new connection.
//     Many ids go in several messages, paced to stay within the gateway's
//     limits on waiting requests and on messages per second (20 a second,
//     40 at once, by default): a program that sends far more than that
//     with SetStatus, Idle, Typing or Signal is closed with 1008, which
//     stops the Client.
//   - Join, UpdateRoomMeta and Leave keep the rooms the client is in,
//     each with this connection's meta; the rooms are joined again, with
//     the newest meta, on every new connection. Room keeps each room's
//     members from the gateway's room_state and room_diff frames; Typing
//     and Signal send short-lived signals to the other members.
//   - The gateway handles a socket's subscribes, unsubscribes, joins,
//     room updates and leaves in order, and refuses one (rate_limited)
//     when 16 wait. The client sends them in order too, with at most 8
//     of them waiting at once, and the rest as those are handled; one the
//     gateway refuses all the same (the user's status changes also wait
//     there), or that its message rate limit may have dropped, is sent
//     again after a short backoff, as the client wants it then, so that a
//     burst of calls ends in the state they asked for.
//   - Server messages arrive on Events as typed events: Snapshot
//     (presence_init), Changes (presence_batch), Self, Denied, RoomState,
//     RoomDiff, RoomSignal, RoomDenied and ServerError, with Connected, Disconnected
//     and Reconnected for the connection. Presence keeps the newest
//     presence of every watched user.
//   - When the connection is lost or a gateway restarts or drains, it
//     reconnects: after a random wait below DrainJitter when the gateway
//     drains (close 1001), else with exponential backoff and full jitter,
//     bounded by Config.Backoff. On the new connection it sends the chosen
//     status, the idle state and the subscriptions again, and delivers
//     Reconnected. A status another device of the user chose (seen in a
//     Self frame) becomes the chosen one, so a reconnect does not undo
//     it; away is never taken over, since it may be automatic.
//   - It stops for good, closing Events and setting Err to an error
//     wrapping ErrRefused, when the gateway refuses it in a way trying again
//     cannot fix: an upgrade refused with 400, 401, 403 or another 4xx
//     except 408 and 429, or close codes 1002, 1003, 1007, 1008 and 1009.
//     A 1008 for an expired token, or for a renewed one the gateway
//     refused, is retried when TokenFunc can give a new one. 429 and 5xx
//     refusals, 1000, 1001, 1011, 1012 and network errors are retried.
//   - Close ends the connection and every goroutine of the client before
//     it returns.
//
// Events never stall the connection: an event that finds the channel full
// (Config.EventBuffer, 256 by default) is dropped and counted in
// Stats.Dropped, and a Lagged event saying how many were dropped is
// delivered before the next one that fits. The caller catches up with
// Presence and Self, which are always current.
//
// # Conn: one WebSocket
//
// Dial opens one WebSocket and returns a *Conn, a thin layer that sends
// client messages and reads server frames, answering pings. It sends no
// heartbeats and does not reconnect: the caller decides when, which is what
// protocol tests and the load generator need. A refused upgrade is a
// *HandshakeError, a close frame from the gateway a *CloseError.
package client
