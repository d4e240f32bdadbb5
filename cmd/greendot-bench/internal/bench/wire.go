package bench

import (
	"time"
)

// Worker commands. The orchestrator writes one command per line to a
// worker's stdin; the worker answers each, in order, with one Reply line on
// its stdout.
const (
	// OpSetup gives the worker its Setup. It must come first.
	OpSetup = "setup"
	// OpConnect dials every connection of the worker and starts its
	// heartbeats.
	OpConnect = "connect"
	// OpSubscribe makes every watcher subscribe to the targets it follows
	// and waits for the answers.
	OpSubscribe = "subscribe"
	// OpPropagate sets targets' statuses at Rate per second for Duration,
	// then waits up to Timeout for the watchers to see the last changes.
	OpPropagate = "propagate"
	// OpDeath stops the targets' heartbeats without closing their sockets
	// and waits up to Timeout for the watchers to see them offline.
	OpDeath = "death"
	// OpChurn replaces targets' and idle users' connections (a new one
	// first, then a clean close of the old one) at Rate per second for
	// Duration.
	OpChurn = "churn"
	// OpStorm expects the connections on Gateways to be closed by a
	// gateway restart from now on, and reconnects each after a random
	// delay below Jitter, until Timeout has passed. It answers at once.
	OpStorm = "storm"
	// OpStormWait waits until every connection OpStorm expected to be
	// closed is connected again, or its timeout has passed.
	OpStormWait = "storm_wait"
	// OpJoin makes every connection join its room of Room (a RoomPlan),
	// waits for each answer, then waits up to Timeout for every member to
	// see its room full.
	OpJoin = "join"
	// OpRoomChurn has the members Room names leave their room and join it
	// again on its schedule, then waits up to Timeout for every member to
	// see the room full again.
	OpRoomChurn = "room_churn"
	// OpTyping has one member of each room send a typing signal on Room's
	// schedule for Duration, then waits Timeout for the last ones.
	OpTyping = "typing"
	// OpEnd says that the run is over: disconnections from now on are
	// expected.
	OpEnd = "end"
	// OpClose closes every connection (with a reset, leaving no port in
	// TIME_WAIT) and ends the worker.
	OpClose = "close"
)

// Command is one instruction to a worker.
type Command struct {
	Op       string        `json:"op"`
	Setup    *Setup        `json:"setup,omitempty"`
	Rate     float64       `json:"rate,omitempty"`
	Duration time.Duration `json:"duration,omitempty"`
	Timeout  time.Duration `json:"timeout,omitempty"`
	Jitter   time.Duration `json:"jitter,omitempty"`
	Gateways []int         `json:"gateways,omitempty"`
	Room     *RoomPlan     `json:"room,omitempty"`
	// Group limits OpJoin to some members: GroupChurners or GroupRest;
	// empty means every member.
	Group string `json:"group,omitempty"`
}

// Setup tells a worker which connections are its own and where to connect.
type Setup struct {
	// Worker is the worker's number in the layout.
	Worker int    `json:"worker"`
	Layout Layout `json:"layout"`
	// URLs are the gateways' WebSocket URLs (ws://host:port/ws), by
	// gateway number.
	URLs []string `json:"urls"`
	// ConnectConcurrency bounds the dials in progress at once.
	ConnectConcurrency int `json:"connect_concurrency"`
	// ConnectRate bounds this worker's dials per second; 0 for no bound.
	ConnectRate float64 `json:"connect_rate,omitempty"`
	// DialTimeout bounds one dial, handshake and hello.
	DialTimeout time.Duration `json:"dial_timeout"`
	// Compression has the connections offer permessage-deflate.
	Compression bool `json:"compression,omitempty"`
}

// Reply answers one Command.
type Reply struct {
	Op     string `json:"op"`
	Worker int    `json:"worker"`
	// Err is set when the command failed as a whole.
	Err string `json:"err,omitempty"`
	// Counts are named counters; Hists are named latency histograms in
	// microseconds, in HdrHistogram's compressed V2 encoding.
	Counts map[string]int64  `json:"counts,omitempty"`
	Hists  map[string][]byte `json:"hists,omitempty"`
	// Errors holds a few examples of the errors counted.
	Errors []string `json:"errors,omitempty"`
}
