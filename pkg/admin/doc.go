// Package admin is greendot's operator interface over NATS: every process
// registers a NATS micro service (greendot-gateway, greendot-reaper,
// greendot-fanout, greendot-webhooks), so that `nats micro ls`, `nats
// micro info` and `nats micro stats` show the fleet, with endpoints an
// operator needs: each process's configuration and load, kicking a user off
// every gateway, a user's live connections, the sockets watching a user,
// and a reaper sweep on demand.
//
// The package holds the subjects and the JSON of every request and reply
// (one place, documented in docs/operations.md) and the server plumbing the
// processes share (Start). Operators call the endpoints with the nats CLI.
//
// Two kinds of endpoint exist. A broadcast endpoint has no queue group:
// every instance of the service receives each request and answers it, so
// the caller gathers several replies (`nats req --replies=0`). A queue
// endpoint is answered by one instance, like any NATS service.
//
// Errors are micro errors: the reply carries the Nats-Service-Error and
// Nats-Service-Error-Code headers, with an HTTP-like code ("400" for a bad
// request, "503" when the process cannot reach its state, "500" otherwise),
// and a JSON body {"error": "<code name>", "message": "..."}.
package admin
