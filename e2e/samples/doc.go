// Package samples holds the tests that run the code samples of
// docs/integration.md and docs/architecture.md that no package of their
// own runs: each finds its sample with doctest.Sample and runs it against
// a real greendot (an embedded NATS server with JetStream, a gateway, a
// reaper and a fanout) over real sockets. A Go sample is in the test's
// source line for line (doctest.Verbatim), with test servers' addresses
// in place of production ones.
//
// The package has no code of its own.
package samples
