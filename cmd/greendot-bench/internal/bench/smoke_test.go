package bench_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/greendot/greendot/cmd/greendot-bench/internal/bench"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/system"
)

// build builds the commands the bench runs as processes: greendot, whose
// gateways, reaper and fanout it starts, and greendot-bench, whose worker
// subcommand holds connections.
func build(t *testing.T) (greendot, greendotBench string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	greendot, greendotBench = filepath.Join(dir, "greendot"), filepath.Join(dir, "greendot-bench")
	for out, pkg := range map[string]string{greendot: system.Greendot, greendotBench: "./cmd/greendot-bench"} {
		if err := system.Build(ctx, out, pkg); err != nil {
			t.Fatal(err)
		}
	}
	return greendot, greendotBench
}

// TestSmoke runs every scenario small and fast, and checks that what it
// reports is correct: every connection made, every watcher seeing every
// change, no false offline. It never checks speed.
func TestSmoke(t *testing.T) {
	tooltest.Long(t)
	greendot, greendotBench := build(t)
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("GREENDOT_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	base := bench.Config{
		Conns:    300,
		Targets:  30,
		Watchers: 30,
		Follows:  5,
		Workers:  2,
		Gateways: 2,
		Duration: 2 * time.Second,
		Greendot: greendot,
		Worker:   []string{greendotBench, "worker"},
		Logger:   logger,
		// Fast timings, so death and churn show what they must within
		// seconds.
		ConnTTL:      2 * time.Second,
		OfflineGrace: time.Second,
		Jitter:       500 * time.Millisecond,
		// Workers in this process run under the race detector, and
		// their protocol is checked end to end.
		InProcessWorkers: true,
	}
	tests := []struct {
		name string
		// scenario is name, unless set.
		scenario string
		// goroutines reads each socket with a goroutine of its own, as
		// where there is no poller.
		goroutines bool
		edit       func(*bench.Config)
		want       map[string]float64 // figure -> exact value
		equal      [][2]string        // figures that must be equal
	}{
		{
			name: "idle",
			edit: func(c *bench.Config) {
				c.Targets, c.Watchers, c.Duration = 0, 0, time.Second
				c.GatewayEnv = []string{"GOMAXPROCS=3"} // not the default (the count of cores) but what the bench set
			},
			want: map[string]float64{"connections held by the gateways": 300, "gateway GOMAXPROCS (the most of any)": 3},
		},
		{
			name:       "idle with a goroutine per socket",
			scenario:   "idle",
			goroutines: true,
			edit:       func(c *bench.Config) { c.Targets, c.Watchers, c.Duration = 0, 0, time.Second },
			want: map[string]float64{
				"connections held by the gateways": 300,
				"connections read through epoll":   0,
			},
		},
		{
			// Watchers' subscriptions and the changes they see, and the
			// death of targets, through sockets read the old way.
			name:       "death with a goroutine per socket",
			scenario:   "death",
			goroutines: true,
			want:       map[string]float64{"targets silenced": 30, "false offline": 0, "connections read through epoll": 0},
		},
		{
			name: "propagation",
			edit: func(c *bench.Config) {
				// Each target changes once, so no change can be coalesced
				// away: every watcher must see every one.
				c.Rate = 15
				// The workers are processes: 'greendot-bench worker'.
				c.InProcessWorkers = false
			},
			want: map[string]float64{
				"status changes sent":                        30,
				"watcher views not converged after settling": 0,
				"changes whose send was not found":           0,
				"false offline":                              0,
			},
			equal: [][2]string{{"changes seen by watchers", "changes expected by watchers"}},
		},
		{
			name: "death",
			want: map[string]float64{"targets silenced": 30, "false offline": 0},
		},
		{
			name: "churn",
			edit: func(c *bench.Config) { c.Rate = 100 },
			want: map[string]float64{"false offline": 0, "connect errors": 0},
		},
		{
			name: "storm",
			want: map[string]float64{"clients reconnected": 300, "clients never closed by the restart": 0},
		},
		{
			name: "room",
			// Rooms need no fast timings: a TTL of 2 s closed members
			// whose heartbeats were late on a loaded machine, and the
			// room was then never full.
			edit: func(c *bench.Config) { c.Targets, c.Watchers, c.Rate, c.ConnTTL = 0, 0, 40, 10*time.Second },
			want: map[string]float64{
				"members joined":                        300,
				"joins failed":                          0,
				"members not shown their room full":     0,
				"leaves sent":                           40,
				"joins sent":                            40,
				"room_diff entries not on the schedule": 0,
				"joins again failed":                    0,
				"members not shown the room full after settling": 0,
			},
		},
		{
			name: "typing",
			edit: func(c *bench.Config) {
				c.Targets, c.Watchers, c.RoomSize, c.TypingInterval = 0, 0, 10, time.Second
				c.ConnTTL = 10 * time.Second // as for room
				c.InProcessWorkers = false
			},
			want: map[string]float64{
				"rooms":                  30,
				"members joined":         300,
				"signals not understood": 0,
				"signals not sent":       0,
			},
			equal: [][2]string{{"signals seen by members", "signals expected by members"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base
			cfg.Scenario = tt.name
			if tt.scenario != "" {
				cfg.Scenario = tt.scenario
			}
			if tt.goroutines {
				defer bench.ReadWithGoroutines()()
			}
			if tt.edit != nil {
				tt.edit(&cfg)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rep, err := bench.Run(ctx, cfg)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			for _, run := range rep.Runs {
				for _, e := range run.Errors {
					t.Logf("worker error example: %s", e)
				}
			}
			get := func(name string) float64 {
				t.Helper()
				s, ok := rep.Figure(name)
				if !ok {
					t.Fatalf("no figure %q in the report", name)
				}
				return s.Median
			}
			common := map[string]float64{
				"connections":               300,
				"connections failed":        0,
				"unexpected disconnections": 0,
			}
			if cfg.Watchers > 0 {
				common["watchers subscribed"] = 30
				common["subscriptions denied"] = 0
				common["false offline (at subscribe)"] = 0
			}
			if runtime.GOOS == "linux" && !tt.goroutines {
				// Every socket is read through the workers' poller.
				common["connections read through epoll"] = 300
			}
			for name, want := range common {
				if got := get(name); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			for name, want := range tt.want {
				if got := get(name); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			for _, pair := range tt.equal {
				if a, b := get(pair[0]), get(pair[1]); a != b {
					t.Errorf("%s = %v, want %s = %v", pair[0], a, pair[1], b)
				}
			}
			switch cfg.Scenario {
			case "propagation":
				// Workers apart and NATS in the bench process: greendot's
				// processes in all is the sum of theirs.
				var parts float64
				for _, name := range []string{"gateways", "reaper", "fanout", "bench process (orchestrator and embedded NATS)"} {
					parts += get(name + " CPU while changing")
				}
				if all := get("greendot's processes (gateways, reaper, fanout, bench process) CPU while changing"); math.Abs(all-parts) > 0.01 {
					t.Errorf("greendot's processes CPU = %v, want the sum of its parts %v", all, parts)
				}
				speedProbed(t, get, "set_status to presence_batch", "changes", "changes seen by watchers")
			case "death":
				if seen, want := get("offline seen by watchers"), get("offline sightings expected"); seen != want {
					t.Errorf("offline seen by watchers = %v, want %v", seen, want)
				}
			case "churn":
				if get("connects") == 0 {
					t.Error("churn made no connections")
				}
			case "room":
				// Each leave and join is shown to the members in the room
				// then: at least the 300 less the 40 that leave.
				for _, name := range []string{"leaves seen in room_diff", "joins seen in room_diff"} {
					if got := get(name); got < 40*259 {
						t.Errorf("%s = %v, want at least %v", name, got, 40*259)
					}
				}
			case "typing":
				if get("typing signals sent") == 0 {
					t.Error("no typing signal was sent")
				}
				speedProbed(t, get, "typing to room_signal", "signals", "signals seen by members")
			}
		})
	}
}

// TestSmokeHostile runs the hostile scenario with tiny windows and checks
// that every phase was measured, that the bystanders missed no change in
// any, and that every attack reached the gateway and was answered as it
// must be. It never checks speed.
func TestSmokeHostile(t *testing.T) {
	tooltest.Long(t)
	greendot, _ := build(t)
	cfg := bench.Config{
		Scenario: bench.ScenarioHostile,
		Conns:    8,
		// One change a second per bystander pair: none is coalesced
		// away, so every one must be seen.
		Rate:             4,
		Duration:         time.Second,
		Greendot:         greendot,
		InProcessWorkers: true,
		Logger:           slog.New(slog.DiscardHandler),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	get := func(name string) float64 {
		t.Helper()
		s, ok := rep.Figure(name)
		if !ok {
			t.Fatalf("no figure %q in the report", name)
		}
		return s.Median
	}
	phases := []string{"baseline", "pong flood", "pongs inside a fragmented message", "empty continuation flood",
		"1 MiB JSON bombs", "slowloris", "idle TCP connections", "request smuggling", "malformed upgrades",
		"message flood over the rate limit"}
	for _, p := range phases {
		if n := get(p + ": changes expected by bystanders"); n == 0 {
			t.Errorf("%s: no change expected", p)
		}
		for _, f := range []string{"changes missed", "bystander views not converged after settling", "bystander disconnections"} {
			if n := get(p + ": " + f); n != 0 {
				t.Errorf("%s: %s = %v, want 0", p, f, n)
			}
		}
		if seen, want := get(p+": changes seen by bystanders"), get(p+": changes expected by bystanders"); seen != want {
			t.Errorf("%s: changes seen by bystanders = %v, want %v", p, seen, want)
		}
		if p != "baseline" && get(p+": attack connections") == 0 {
			t.Errorf("%s: the attack made no connection", p)
		}
	}
	for name, least := range map[string]float64{
		"pong flood: closed with 1008":                           1,
		"1 MiB JSON bombs: closed with 1009":                     1,
		"request smuggling: answered 400":                        1,
		"malformed upgrades: answered 400":                       1,
		"message flood over the rate limit: rate_limited errors": 1,
		"message flood over the rate limit: closed with 1008":    1,
	} {
		if got := get(name); got < least {
			t.Errorf("%s = %v, want at least %v", name, got, least)
		}
	}
}

// speedProbed checks, where the workers can probe the machine's speed,
// the figures of what they found (runner.addSlow): a share of the time,
// a median, nothing left unlogged, and every delivery seen either clear
// of the slow spans or not.
func speedProbed(t *testing.T, get func(string) float64, what, things, seenFigure string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		return
	}
	slow := get("machine ran slow (speed probe)")
	if slow < 0 || slow > 100 {
		t.Errorf("machine ran slow %v%% of the time", slow)
	}
	if us := get("speed probe median"); us <= 0 {
		t.Errorf("speed probe median %v µs", us)
	}
	if n := get(things + " seen but not logged"); n != 0 {
		t.Errorf("%v %s seen but not logged", n, things)
	}
	if clear, seen := get(things+" seen clear of slow spans"), get(seenFigure); clear > seen || clear < seen && slow == 0 {
		t.Errorf("%s seen clear of slow spans = %v of %v, with the machine slow %v%% of the time", things, clear, seen, slow)
	}
	if p99, all := get(what+" clear of slow spans p99"), get(what+" max"); p99 > all {
		t.Errorf("p99 clear of slow spans %v ms, beyond the longest of all %v ms", p99, all)
	}
}

// TestStartFailureStopsWhatStarted: when a process of the system does not
// start (here a greendot that exits at once), the run fails with
// ErrSystem, after stopping what it had started.
func TestStartFailureStopsWhatStarted(t *testing.T) {
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Fatal(err)
	}
	_, err = bench.Run(context.Background(), bench.Config{
		Scenario: "idle",
		Conns:    10,
		Workers:  1,
		Gateways: 1,
		Duration: time.Second,
		Greendot: falseBin,
		Worker:   []string{falseBin},
		Logger:   slog.New(slog.DiscardHandler),
	})
	if !errors.Is(err, bench.ErrSystem) {
		t.Fatalf("run with a greendot that exits at once: %v, want ErrSystem", err)
	}
}
