package bench

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLayoutPlacesEveryConnectionOnce(t *testing.T) {
	for _, l := range []Layout{
		{Run: "r_", Targets: 30, Watchers: 30, Idle: 240, Follows: 5, Workers: 2, Gateways: 2, Sources: 1},
		{Run: "r_", Targets: 1000, Watchers: 1000, Idle: 98000, Follows: 10, Workers: 7, Gateways: 7, Sources: 5},
		{Run: "r_", Targets: 7, Watchers: 3, Idle: 0, Follows: 2, Workers: 3, Gateways: 1, Sources: 0},
		{Run: "r_", Idle: 10, Workers: 4, Gateways: 3},
	} {
		if err := l.Validate(); err != nil {
			t.Fatalf("%+v: %v", l, err)
		}
		total := 0
		seen := map[string]bool{}
		for k := range l.Workers {
			total += l.WorkerConns(k)
			for _, r := range []struct {
				role   Role
				lo, hi int
			}{
				{RoleTarget, 0, 0}, {RoleWatcher, 0, 0}, {RoleIdle, 0, 0},
			} {
				switch r.role {
				case RoleTarget:
					r.lo, r.hi = l.TargetRange(k)
				case RoleWatcher:
					r.lo, r.hi = l.WatcherRange(k)
				default:
					r.lo, r.hi = l.IdleRange(k)
				}
				for n := r.lo; n < r.hi; n++ {
					u := l.User(r.role, n)
					if seen[u] {
						t.Errorf("%s placed twice", u)
					}
					seen[u] = true
					role, got, ok := l.ParseUser(u)
					if !ok || role != r.role || got != n {
						t.Errorf("ParseUser(%q) = %c %d %v, want %c %d", u, role, got, ok, r.role, n)
					}
					if r.role == RoleWatcher {
						tlo, thi := l.TargetRange(k)
						f := l.Followed(n)
						if len(f) != l.Follows {
							t.Errorf("watcher %d follows %d targets, want %d", n, len(f), l.Follows)
						}
						sorted := slices.Clone(f)
						slices.Sort(sorted)
						if len(slices.Compact(sorted)) != len(f) {
							t.Errorf("watcher %d follows %v: not distinct", n, f)
						}
						for _, x := range f {
							if x < tlo || x >= thi {
								t.Errorf("watcher %d of worker %d follows target %d, outside [%d, %d)", n, k, x, tlo, thi)
							}
						}
					}
				}
			}
		}
		if total != l.Total() || len(seen) != l.Total() {
			t.Errorf("%+v: placed %d (%d distinct), want %d", l, total, len(seen), l.Total())
		}
		for idx := range l.Total() {
			if g := l.Gateway(idx); g < 0 || g >= l.Gateways {
				t.Errorf("connection %d on gateway %d of %d", idx, g, l.Gateways)
			}
			src := l.Source(idx)
			if l.Sources == 0 {
				if src != nil {
					t.Errorf("connection %d has source %v with no sources", idx, src)
				}
				continue
			}
			if ip := src.IP.To4(); ip[0] != 127 || ip[3] < 2 || int(ip[3]) >= 2+l.Sources {
				t.Errorf("connection %d from %v, want 127.0.0.2 to 127.0.0.%d", idx, src.IP, 1+l.Sources)
			}
		}
	}
}

func TestLayoutWatchersPerTargetAreEven(t *testing.T) {
	l := Layout{Run: "r_", Targets: 1000, Watchers: 1000, Follows: 10, Workers: 7, Gateways: 7}
	count := make([]int, l.Targets)
	for w := range l.Watchers {
		for _, x := range l.Followed(w) {
			count[x]++
		}
	}
	lo, hi := slices.Min(count), slices.Max(count)
	if lo < 9 || hi > 11 {
		t.Errorf("watchers per target from %d to %d, want about 10", lo, hi)
	}
}

func TestLayoutRejects(t *testing.T) {
	good := Layout{Run: "r_", Targets: 10, Watchers: 10, Idle: 10, Follows: 5, Workers: 2, Gateways: 1}
	tests := []struct {
		name string
		edit func(*Layout)
		want string
	}{
		{"no run prefix", func(l *Layout) { l.Run = "" }, "run prefix"},
		{"a dot in the prefix", func(l *Layout) { l.Run = "a.b" }, "run prefix"},
		{"no connections", func(l *Layout) { l.Targets, l.Watchers, l.Idle = 0, 0, 0 }, "at least one connection"},
		{"no workers", func(l *Layout) { l.Workers = 0 }, "worker"},
		{"too many sources", func(l *Layout) { l.Sources = MaxSources + 1 }, "source addresses"},
		{"watchers without targets", func(l *Layout) { l.Targets = 0 }, "need targets"},
		{"more follows than a worker has targets", func(l *Layout) { l.Follows = 6 }, "follows 6"},
		{"no follows", func(l *Layout) { l.Follows = 0 }, "follows 0"},
		{"fewer watchers than workers", func(l *Layout) { l.Watchers, l.Workers, l.Follows = 1, 2, 1 }, "at least one per worker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := good
			tt.edit(&l)
			err := l.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want ErrInvalidConfig mentioning %q", err, tt.want)
			}
		})
	}
	if err := good.Validate(); err != nil {
		t.Errorf("good layout: %v", err)
	}
	for _, id := range []string{"r_", "r_t", "r_x1", "r_t01", "r_t-1", "x_t1", "r_t1a"} {
		if _, _, ok := good.ParseUser(id); ok {
			t.Errorf("ParseUser(%q) accepted", id)
		}
	}
}

func TestConfigDefaultsAndRejects(t *testing.T) {
	cfg, err := Config{Scenario: ScenarioPropagation, Conns: 100000, Greendot: "/bin/true"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	cfg.run = "r_"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults for 100k: %v", err)
	}
	if cfg.Workers != 7 || cfg.Gateways != 7 || cfg.Sources != 5 || cfg.Targets != 1000 || cfg.Watchers != 1000 || cfg.Follows != 10 || cfg.Rate != 1000 {
		t.Errorf("defaults for 100k: workers %d gateways %d sources %d targets %d watchers %d follows %d rate %g",
			cfg.Workers, cfg.Gateways, cfg.Sources, cfg.Targets, cfg.Watchers, cfg.Follows, cfg.Rate)
	}
	idle, err := Config{Greendot: "/bin/true"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if idle.Scenario != ScenarioIdle || idle.Conns != 1000 || idle.Targets != 0 || idle.Watchers != 0 {
		t.Errorf("idle defaults: %+v", idle)
	}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"unknown scenario", func(c *Config) { c.Scenario = "soak" }, "scenario"},
		{"too many per worker", func(c *Config) { c.Workers = 1 }, "at most 15000 per worker"},
		{"too many per source", func(c *Config) { c.Sources = 1 }, "source addresses"},
		{"storm on existing gateways", func(c *Config) {
			c.Scenario, c.GatewayURLs, c.Gateways = ScenarioStorm, []string{"127.0.0.1:1"}, 1
		}, "storm"},
		{"graph without NATS", func(c *Config) { c.GatewayURLs, c.Gateways = []string{"127.0.0.1:1"}, 1 }, "--nats-url"},
		{"targets and watchers too many", func(c *Config) { c.Targets, c.Watchers = 60000, 50000 }, "do not fit"},
		{"bad storm signal", func(c *Config) { c.StormSignal = "hup" }, "storm signal"},
		{"negative rate", func(c *Config) { c.Rate = -1 }, "rate"},
		{"zero repeat", func(c *Config) { c.Repeat = 0 }, "repeat"},
		{"too long", func(c *Config) { c.Duration = time.Hour }, "duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			tt.edit(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want ErrInvalidConfig mentioning %q", err, tt.want)
			}
		})
	}
}
