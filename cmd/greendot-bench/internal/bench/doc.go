// Package bench is greendot's load generator, the command greendot-bench:
// it speaks the client protocol over real WebSockets to measure what a
// deployment can hold and how fast it shows changes.
//
// An orchestrator (Run) starts the system under test with package system
// (an embedded NATS server, and gateway, reaper and fanout processes of a
// greendot binary), or uses an existing one, and spreads the connections
// of a run over worker processes (`greendot-bench worker`), each holding
// at most about 15,000
// sockets and dialing from several loopback source addresses so that
// neither the per-process file limit nor the ephemeral port range is the
// bound. Workers read commands as JSON lines on stdin and answer each with
// one JSON line on stdout (RunWorker). A worker holds its sockets as the
// gateway does: on Linux one epoll instance (package netpoll) tells which
// are readable, and a few goroutines read those with pooled buffers, so an
// idle socket has no goroutine and no buffer of its own; elsewhere, or for
// a socket without a descriptor, a goroutine per socket reads it.
//
// The scenarios (idle, propagation, death, churn, storm) each run for a
// bounded time and count, and produce Figures: named, measured values with
// their unit and, where issue targets exist, the target. Latencies are
// recorded in HdrHistograms in the workers and merged by the orchestrator.
//
// A Layout places every connection (its user, worker, gateway and source
// address) by pure functions, so the orchestrator, which writes the follow
// graph, and the workers, which connect and subscribe, agree on it without
// exchanging lists.
package bench
