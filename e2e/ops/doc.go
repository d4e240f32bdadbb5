// Package ops holds the tests that keep docs/operations.md and the Grafana
// dashboard true. They run a whole greendot (embedded NATS with its
// monitoring port, two gateways, a reaper and a fanout with their metrics
// listeners) and:
//
//   - check every bucket, key, subject, micro service, metric and flag
//     name the operations page mentions against the code;
//   - run every command of the page's sh blocks, through nats.go and
//     net/http as the nats CLI and curl would, and compare each reply with
//     the JSON sample the page shows after it;
//   - answer the page's headline question ("is alice online, on which
//     devices, since when, and who is watching her?") the way it says;
//   - check that the dashboard is importable and queries metrics that
//     exist.
//
// The package has no code of its own.
package ops
