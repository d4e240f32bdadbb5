// Package e2e holds whole-system tests of greendot: gateways, reapers and
// fanouts over an embedded NATS server with JetStream, driven by real
// WebSocket clients on loopback.
//
// The package has no code of its own. Its tests check properties no single
// process can promise alone, above all the presence invariant of
// docs/architecture.md: watchers are never told a user is offline while one
// of the user's connections is live, and never left seeing a user online
// after the user's last connection is gone.
package e2e
