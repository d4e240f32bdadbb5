// Package system assembles a greendot system: an embedded NATS server with
// JetStream, gateways, reapers, fanouts and webhooks processes run in this
// process, and child processes of a greendot binary. It is the one way
// greendot's standalone mode, its system tests, its fault tests and its
// load generator start and stop these parts.
//
// The parts can be used alone:
//
//   - StartNATS starts an embedded nats-server with JetStream from a
//     NATSConfig (a store directory, a listen address or none, a logger
//     adapter to slog, optional limits) and checks that JetStream runs.
//   - StartGateway, StartReaper, StartFanout and StartWebhooks run a service
//     in this process over a NATS connection of its own. Every service has the same
//     lifecycle (Proc): it runs from the start; AwaitReady waits until it is
//     ready; Stop cancels it, waits for it to return and closes its
//     connection; Err says how it ended.
//   - StartChild runs a child process (a greendot binary, or any other),
//     keeping its log in a file or in memory, and can signal it, wait for it
//     with a timeout, kill it and show the end of its log. Build builds a
//     command of greendot's module with the go tool.
//
// A System holds such parts together: Start starts its NATS server (or
// names an existing one), its methods start services and children that
// connect to it, Ready says whether its NATS server and every service are
// ready (naming the first part that is not, as standalone mode's /readyz
// does), and Stop stops them in order: gateways first, so that what
// their closing sockets write is still processed, then reapers, fanouts,
// webhooks processes and every other child, then the connections the system made, then NATS.
package system
