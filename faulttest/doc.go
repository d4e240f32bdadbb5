// Package faulttest proves that greendot survives the failures of a real
// deployment, and that the deployment files say what the code does.
//
// It is a long suite: its tests run in CI (CI=true) and with
// GREENDOT_LONG_TESTS=1, and go test ./... skips them elsewhere, saying so
// on one line (tooltest.Long).
//
// The package has no code of its own. Its tests run greendot's processes
// against real NATS servers on loopback: an in-process three-node JetStream
// cluster (nats-server/v2, routes between the nodes, buckets with three
// replicas) or a single node with file storage. Gateways, reapers and
// fanouts run either in the test process over their own NATS connections, or
// as child processes of the built greendot binary, so that a test can kill
// one with SIGKILL or stop it with SIGTERM as an orchestrator would. Clients
// are real WebSockets; watchers record every presence they are told.
//
// Each fault test injects one failure into running traffic and then checks
// what every watcher ends up seeing against the truth the test kept (who is
// connected, with which chosen status), that users who stayed connected were
// never shown offline where the protocol forbids it, and that no transition
// was lost:
//
//   - TestNATSNodeKilled: a node of the cluster dies mid-traffic.
//   - TestGatewayKilled: a gateway process is killed with SIGKILL.
//   - TestWorkersKilled: one of two reapers and one of two fanouts are
//     killed with SIGKILL.
//   - TestNATSRestarted: a single-node NATS server with file storage stops
//     and starts again.
//   - TestGatewayDrain: a gateway stops on SIGTERM and its clients move to
//     another gateway on 1001.
//
// Every NATS server is loaded from the repository's own configuration
// (nats.conf for a cluster node, deploy/nats/single.conf for one server),
// every process connects with its role's user, and a permission violation
// logged by any server fails the test. TestPermissions runs the real
// processes through everything they do under those users, then checks what
// each role must not do. TestComposeFile, TestTaskfile and TestDockerfile
// check the deployment files against the built binary's flags and
// nats-server's parser; TestLocalCluster runs what `task cluster` runs.
//
// The tests wait for eventual state with bounded polls (a sleep only sets
// how long traffic or an outage lasts, never what a test waits for), and
// assert no timing tighter than the protocol's own limits, so that they
// hold on a loaded two-core machine.
package faulttest
