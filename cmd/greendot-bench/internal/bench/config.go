package bench

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"
)

// The scenarios.
const (
	// ScenarioIdle holds the connections with heartbeats and measures the
	// gateways' memory and CPU per connection and their KV write rate.
	ScenarioIdle = "idle"
	// ScenarioPropagation has targets change status at a given rate and
	// measures how long their watchers take to see each change.
	ScenarioPropagation = "propagation"
	// ScenarioDeath stops the targets' heartbeats without closing their
	// sockets and measures how long after the TTL their watchers see them
	// offline.
	ScenarioDeath = "death"
	// ScenarioChurn replaces connections at a given rate and counts the
	// false offline events watchers see.
	ScenarioChurn = "churn"
	// ScenarioStorm restarts gateways and measures how long their clients
	// take to be connected again.
	ScenarioStorm = "storm"
	// ScenarioRoom puts every connection in one room, then has members
	// leave and join it again at a given rate, and measures how long a
	// join takes to be answered with the room's state and how long the
	// other members take to see each change.
	ScenarioRoom = "room"
	// ScenarioTyping puts the connections in rooms of RoomSize members,
	// has one member of each room send a typing signal every
	// TypingInterval, and measures how long the others take to see it.
	ScenarioTyping = "typing"
	// ScenarioHostile has pairs of mutual followers, one watching the
	// other change status at a given rate, through a baseline phase and
	// then one phase per attack on a gateway from raw sockets, and
	// measures the watchers' latency and losses in each.
	ScenarioHostile = "hostile"
)

// Scenarios lists every scenario, in the order the documentation gives.
var Scenarios = []string{ScenarioIdle, ScenarioPropagation, ScenarioDeath, ScenarioChurn, ScenarioStorm, ScenarioRoom, ScenarioTyping, ScenarioHostile}

// rooms reports whether the scenario is one of rooms, whose connections
// are all members and none targets or watchers.
func (c *Config) rooms() bool { return c.Scenario == ScenarioRoom || c.Scenario == ScenarioTyping }

// Default limits.
const (
	// DefaultConnsPerWorker keeps a worker process well under a 20,000
	// open file limit.
	DefaultConnsPerWorker = 15000
	// DefaultConnsPerGateway keeps a gateway process well under a 20,000
	// open file limit.
	DefaultConnsPerGateway = 15000
	// connsPerSource keeps each loopback source address well inside the
	// ephemeral port range (32768-60999 by default).
	connsPerSource = 20000
)

// Config configures a bench run. Zero fields get the defaults their
// comments state.
type Config struct {
	// Scenario is one of Scenarios; empty means idle.
	Scenario string `json:"scenario"`
	// Conns is the number of live connections; zero means 1000.
	Conns int `json:"conns"`
	// Targets, Watchers and Follows shape the watched part of the
	// connections: Watchers each follow Follows of the Targets. Zero
	// Targets means none in idle and Conns/10 (at most 1000) otherwise;
	// zero Watchers means as many as targets; zero Follows means
	// min(10, targets per worker).
	Targets  int `json:"targets"`
	Watchers int `json:"watchers"`
	Follows  int `json:"follows"`

	// Workers is the number of worker processes; zero means enough for
	// ConnsPerWorker each. ConnsPerWorker zero means 15000.
	Workers        int `json:"workers"`
	ConnsPerWorker int `json:"conns_per_worker"`
	// Gateways is the number of gateway processes started; zero means
	// enough for ConnsPerGateway each. ConnsPerGateway zero means 15000.
	Gateways        int `json:"gateways"`
	ConnsPerGateway int `json:"conns_per_gateway"`
	// Sources is the number of loopback source addresses (127.0.0.2 and
	// up); zero means one per 20,000 connections.
	Sources int `json:"sources"`

	// NATSURL, when set, is used instead of an embedded NATS server.
	NATSURL string `json:"nats_url,omitempty"`
	// GatewayURLs, when set, are used instead of starting gateways,
	// reaper and fanout (storm needs gateways of its own).
	GatewayURLs []string `json:"gateway_urls,omitempty"`
	// GatewayArgs are more flags for the gateways started.
	GatewayArgs []string `json:"gateway_args,omitempty"`
	// GatewayEnv are NAME=VALUE variables added to the environment of the
	// gateways started (GOMAXPROCS=1, say).
	GatewayEnv []string `json:"gateway_env,omitempty"`
	// Timings of the gateways started; zero leaves the gateway's default.
	ConnTTL           time.Duration `json:"conn_ttl,omitempty"`
	HeartbeatInterval time.Duration `json:"heartbeat_interval,omitempty"`
	BatchInterval     time.Duration `json:"batch_interval,omitempty"`
	OfflineGrace      time.Duration `json:"offline_grace,omitempty"`

	// ConnectRate bounds dials per second over all workers; zero means no
	// bound. ConnectConcurrency bounds the dials in progress per worker;
	// zero means 64.
	ConnectRate        float64 `json:"connect_rate,omitempty"`
	ConnectConcurrency int     `json:"connect_concurrency"`
	// DialTimeout bounds one dial, handshake and hello; zero means 30s.
	DialTimeout time.Duration `json:"dial_timeout"`
	// WSCompression has the connections offer permessage-deflate, which
	// the gateways (on by default) then accept.
	WSCompression bool `json:"ws_compression,omitempty"`

	// Duration is the measurement window (idle) or how long changes
	// (propagation), replacements (churn), leaves and joins (room) or
	// typing signals (typing) go on, or each phase's window (hostile);
	// zero means 30s.
	Duration time.Duration `json:"duration"`
	// Rate is status changes per second over all targets (propagation;
	// zero means one per target per second, at most 1000), connection
	// replacements per second (churn; zero means 1000), or leaves and
	// joins per second (room; zero means 100), or status changes per
	// second over all targets in every phase (hostile; zero means 20).
	Rate float64 `json:"rate"`
	// RoomSize is the members of each room (typing; zero means 10).
	RoomSize int `json:"room_size,omitempty"`
	// TypingInterval is how often each room gets a typing signal
	// (typing; zero means 2s).
	TypingInterval time.Duration `json:"typing_interval,omitempty"`
	// Jitter is the longest a client waits before reconnecting after a
	// storm's restart; zero means 5s.
	Jitter time.Duration `json:"jitter"`
	// StormSignal stops the gateways in a storm: "term" (drain, the
	// default) or "kill".
	StormSignal string `json:"storm_signal"`
	// StormGateways is how many gateways a storm restarts; zero means all.
	StormGateways int `json:"storm_gateways"`

	// Repeat runs the scenario this many times, each on a fresh system;
	// zero means 1.
	Repeat int `json:"repeat"`
	// Greendot is the greendot executable to start gateways, reapers and
	// fanouts from. Empty means one built from ./cmd/greendot into the
	// work directory, which needs the go command and a working directory
	// inside greendot's module.
	Greendot string `json:"-"`
	// Worker is the command line of a worker process; empty means this
	// executable with the argument "worker" (greendot-bench worker).
	Worker []string `json:"-"`
	// InProcessWorkers runs the workers as goroutines of this process
	// instead of processes (for tests).
	InProcessWorkers bool `json:"-"`
	// Logger receives progress; nil discards it.
	Logger *slog.Logger `json:"-"`

	// run names this run's users and gateways.
	run string
}

// withDefaults returns cfg with zero fields set.
func (c Config) withDefaults() (Config, error) {
	if c.Scenario == "" {
		c.Scenario = ScenarioIdle
	}
	c.Conns = cmpOr(c.Conns, 1000)
	c.ConnsPerWorker = cmpOr(c.ConnsPerWorker, DefaultConnsPerWorker)
	c.ConnsPerGateway = cmpOr(c.ConnsPerGateway, DefaultConnsPerGateway)
	if c.Workers == 0 {
		c.Workers = ceilDiv(c.Conns, c.ConnsPerWorker)
	}
	if c.Gateways == 0 {
		if len(c.GatewayURLs) > 0 {
			c.Gateways = len(c.GatewayURLs)
		} else {
			c.Gateways = ceilDiv(c.Conns, c.ConnsPerGateway)
		}
	}
	if c.Sources == 0 {
		c.Sources = min(MaxSources, ceilDiv(c.Conns, connsPerSource))
	}
	if c.Scenario == ScenarioHostile {
		// Pairs: each watcher follows one target.
		if c.Targets == 0 {
			c.Targets = max(c.Workers, c.Conns/2)
		}
		c.Follows = cmpOr(c.Follows, 1)
	}
	if c.Scenario != ScenarioIdle && !c.rooms() && c.Targets == 0 {
		c.Targets = max(c.Workers, min(1000, c.Conns/10))
	}
	if c.Targets > 0 && c.Watchers == 0 {
		c.Watchers = c.Targets
	}
	if c.Watchers > 0 && c.Follows == 0 {
		c.Follows = max(1, min(10, c.Targets/c.Workers))
	}
	c.ConnectConcurrency = cmpOr(c.ConnectConcurrency, 64)
	c.DialTimeout = cmpOr(c.DialTimeout, 30*time.Second)
	c.Duration = cmpOr(c.Duration, 30*time.Second)
	if c.Rate == 0 {
		switch c.Scenario {
		case ScenarioPropagation:
			c.Rate = float64(min(1000, c.Targets))
		case ScenarioChurn:
			c.Rate = 1000
		case ScenarioRoom:
			c.Rate = 100
		case ScenarioHostile:
			c.Rate = 20
		}
	}
	if c.Scenario == ScenarioTyping {
		c.RoomSize = cmpOr(c.RoomSize, 10)
		c.TypingInterval = cmpOr(c.TypingInterval, 2*time.Second)
	}
	c.Jitter = cmpOr(c.Jitter, 5*time.Second)
	c.StormSignal = cmpOr(c.StormSignal, "term")
	c.Repeat = cmpOr(c.Repeat, 1)
	if len(c.Worker) == 0 && !c.InProcessWorkers {
		exe, err := os.Executable()
		if err != nil {
			return c, fmt.Errorf("%w: find the greendot-bench executable: %v", ErrInvalidConfig, err)
		}
		c.Worker = []string{exe, "worker"}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Validate reports whether c (with defaults) can be run.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	badVar := badEnv(c.GatewayEnv)
	known := false
	for _, s := range Scenarios {
		known = known || s == c.Scenario
	}
	switch {
	case !known:
		return bad("scenario %q: want idle, propagation, death, churn, storm, room, typing or hostile", c.Scenario)
	case c.Conns < 1:
		return bad("conns %d: want at least 1", c.Conns)
	case c.Targets+c.Watchers > c.Conns:
		return bad("%d targets and %d watchers do not fit in %d connections", c.Targets, c.Watchers, c.Conns)
	case c.Scenario != ScenarioIdle && !c.rooms() && (c.Targets == 0 || c.Watchers == 0):
		return bad("scenario %s needs targets and watchers", c.Scenario)
	case c.rooms() && (c.Targets > 0 || c.Watchers > 0):
		return bad("scenario %s has no targets or watchers: every connection is a room member", c.Scenario)
	case c.Scenario == ScenarioRoom && c.Conns < 4:
		return bad("scenario room needs at least 4 connections")
	case c.Scenario == ScenarioRoom && c.Rate > 0 && c.roomPlan().Pairs < 1:
		return bad("%g leaves and joins a second for %v is not one of each", c.Rate, c.Duration)
	case c.Scenario == ScenarioTyping && (c.RoomSize < 2 || c.Conns < c.RoomSize):
		return bad("room size %d for %d connections: want at least 2 members and one room", c.RoomSize, c.Conns)
	case c.TypingInterval < 0:
		return bad("typing interval must not be negative")
	case c.Workers < 1 || ceilDiv(c.Conns, c.Workers) > c.ConnsPerWorker:
		return bad("%d workers for %d connections: at most %d per worker", c.Workers, c.Conns, c.ConnsPerWorker)
	case c.Gateways < 1:
		return bad("gateways %d: want at least 1", c.Gateways)
	case len(c.GatewayURLs) > 0 && c.Gateways != len(c.GatewayURLs):
		return bad("%d gateways but %d gateway URLs", c.Gateways, len(c.GatewayURLs))
	case c.Scenario == ScenarioHostile && c.Duration*time.Duration(len(attacks)+1) > maxCommandTime:
		return bad("hostile: %d phases of %v each: want at most %v in all", len(attacks)+1, c.Duration, maxCommandTime)
	case len(c.GatewayURLs) > 0 && c.Scenario == ScenarioStorm:
		return bad("storm restarts gateways: it cannot use --gateway-url")
	case len(c.GatewayURLs) > 0 && c.Watchers > 0 && c.NATSURL == "":
		return bad("with --gateway-url, watchers need --nats-url to write the follow graph")
	case c.Sources < 0 || c.Sources > MaxSources:
		return bad("sources %d: want 1 to %d", c.Sources, MaxSources)
	case ceilDiv(c.Conns, max(c.Sources, 1)) > 28000:
		return bad("%d connections over %d source addresses: at most 28000 each fit the ephemeral port range", c.Conns, c.Sources)
	case c.ConnectRate < 0 || c.Rate < 0:
		return bad("rates must not be negative")
	case c.ConnectConcurrency < 1:
		return bad("connect concurrency %d: want at least 1", c.ConnectConcurrency)
	case c.Duration <= 0 || c.Duration > maxCommandTime:
		return bad("duration %v: want more than 0 and at most %v", c.Duration, maxCommandTime)
	case c.Scenario == ScenarioPropagation && c.Rate <= 0, c.Scenario == ScenarioChurn && c.Rate <= 0, c.Scenario == ScenarioRoom && c.Rate <= 0,
		c.Scenario == ScenarioHostile && c.Rate <= 0:
		return bad("scenario %s needs a positive rate", c.Scenario)
	case c.StormSignal != "term" && c.StormSignal != "kill":
		return bad("storm signal %q: want term or kill", c.StormSignal)
	case c.StormGateways < 0 || c.StormGateways > c.Gateways:
		return bad("storm gateways %d: want 0 (all) to %d", c.StormGateways, c.Gateways)
	case len(c.GatewayEnv) > 0 && len(c.GatewayURLs) > 0:
		return bad("--gateway-env is for the gateways the bench starts: it cannot use --gateway-url")
	case badVar >= 0:
		return bad("gateway environment variable %q: want NAME=VALUE, the name of letters, digits and _, not starting with a digit", c.GatewayEnv[badVar])
	case c.Repeat < 1 || c.Repeat > 100:
		return bad("repeat %d: want 1 to 100", c.Repeat)
	case c.ConnTTL < 0 || c.HeartbeatInterval < 0 || c.BatchInterval < 0 || c.OfflineGrace < 0 || c.Jitter < 0 || c.DialTimeout < 0:
		return bad("durations must not be negative")
	}
	return c.layout().Validate()
}

// roomChurners is how many members of the room scenario's room leave and
// join: as many as a truncated room_state lists by default, so that every
// member is shown them.
const roomChurners = 100

// roomPlan returns the plan of a rooms scenario, without its start.
func (c *Config) roomPlan() RoomPlan {
	p := RoomPlan{Prefix: "bench:" + c.run}
	switch c.Scenario {
	case ScenarioRoom:
		// Each churner is out of the room for half its round.
		p.Churners = min(roomChurners, c.Conns/2)
		p.Hold = max(1, p.Churners/2)
		p.Pairs = int(c.Rate * c.Duration.Seconds() / 2)
		p.Rate = c.Rate
	case ScenarioTyping:
		p.Size = c.RoomSize
		if c.TypingInterval > 0 {
			p.Rate = float64(c.Conns/max(c.RoomSize, 1)) / c.TypingInterval.Seconds()
		}
	}
	return p
}

// layout places the run's connections.
func (c *Config) layout() Layout {
	return Layout{
		Run:      c.run,
		Targets:  c.Targets,
		Watchers: c.Watchers,
		Idle:     c.Conns - c.Targets - c.Watchers,
		Follows:  c.Follows,
		Workers:  c.Workers,
		Gateways: c.Gateways,
		Sources:  c.Sources,
	}
}

// badEnv returns the index of the first of vars that is not NAME=VALUE
// with a name envName accepts, or -1.
func badEnv(vars []string) int {
	return slices.IndexFunc(vars, func(kv string) bool {
		name, _, ok := strings.Cut(kv, "=")
		return !ok || !envName(name)
	})
}

// envName reports whether name is ASCII letters, digits and underscores,
// not starting with a digit.
func envName(name string) bool {
	for i, r := range name {
		letter := r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !letter && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return name != ""
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
