package bench

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Role is what a connection does in a run.
type Role byte

// The roles. Every connection heartbeats; targets are watched, watchers
// watch, idle connections only hold.
const (
	RoleTarget  Role = 't'
	RoleWatcher Role = 'w'
	RoleIdle    Role = 'i'
)

// Layout places a run's connections: which user each one is, which worker
// process holds it, which gateway it connects to, which loopback source
// address it dials from, and whom each watcher follows. Every function of
// it is pure, so the orchestrator (which writes the follow graph) and the
// workers (which connect and subscribe) agree without exchanging lists.
//
// Connections are numbered globally: targets first, then watchers, then
// idle connections. Each worker holds a contiguous share of each role, and
// a watcher follows only targets of its own worker, so that a change's
// send time and its receipt are seen by one process and one clock.
type Layout struct {
	// Run prefixes every user id, so runs against an existing system do
	// not meet each other's users.
	Run string `json:"run"`
	// Targets, Watchers and Idle count the connections of each role.
	Targets  int `json:"targets"`
	Watchers int `json:"watchers"`
	Idle     int `json:"idle"`
	// Follows is how many targets each watcher follows and subscribes to.
	Follows int `json:"follows"`
	// Workers is the number of worker processes.
	Workers int `json:"workers"`
	// Gateways is the number of gateway URLs connections are spread over.
	Gateways int `json:"gateways"`
	// Sources is the number of loopback source addresses (127.0.0.2 and
	// up) connections are spread over; 0 dials from the default address.
	Sources int `json:"sources"`
}

// MaxSources is the most loopback source addresses a layout may use
// (127.0.0.2 to 127.0.0.251).
const MaxSources = 250

// Total returns the number of connections.
func (l Layout) Total() int { return l.Targets + l.Watchers + l.Idle }

// Validate reports whether the layout can be run.
func (l Layout) Validate() error {
	switch {
	case l.Run == "" || strings.ContainsAny(l.Run, ".*> "):
		return fmt.Errorf("%w: run prefix %q", ErrInvalidConfig, l.Run)
	case l.Targets < 0 || l.Watchers < 0 || l.Idle < 0 || l.Total() == 0:
		return fmt.Errorf("%w: want at least one connection and no negative counts", ErrInvalidConfig)
	case l.Workers < 1 || l.Gateways < 1:
		return fmt.Errorf("%w: want at least one worker and one gateway", ErrInvalidConfig)
	case l.Sources < 0 || l.Sources > MaxSources:
		return fmt.Errorf("%w: source addresses %d: want 0 to %d", ErrInvalidConfig, l.Sources, MaxSources)
	case l.Watchers > 0 && l.Targets == 0:
		return fmt.Errorf("%w: watchers need targets to follow", ErrInvalidConfig)
	case l.Watchers > 0 && (l.Follows < 1 || l.Follows > l.Targets/l.Workers):
		return fmt.Errorf("%w: follows %d: want 1 to targets/workers = %d (a watcher follows targets of its own worker)",
			ErrInvalidConfig, l.Follows, l.Targets/l.Workers)
	case l.Watchers > 0 && l.Watchers < l.Workers:
		return fmt.Errorf("%w: %d watchers for %d workers: want at least one per worker", ErrInvalidConfig, l.Watchers, l.Workers)
	}
	return nil
}

// share returns the range [lo, hi) of total items that worker k holds.
func (l Layout) share(total, k int) (lo, hi int) {
	return total * k / l.Workers, total * (k + 1) / l.Workers
}

// TargetRange returns the targets (by target number) held by worker k.
func (l Layout) TargetRange(k int) (lo, hi int) { return l.share(l.Targets, k) }

// WatcherRange returns the watchers (by watcher number) held by worker k.
func (l Layout) WatcherRange(k int) (lo, hi int) { return l.share(l.Watchers, k) }

// IdleRange returns the idle connections (by idle number) held by worker k.
func (l Layout) IdleRange(k int) (lo, hi int) { return l.share(l.Idle, k) }

// WorkerConns returns how many connections worker k holds.
func (l Layout) WorkerConns(k int) int {
	a, b := l.TargetRange(k)
	c, d := l.WatcherRange(k)
	e, f := l.IdleRange(k)
	return b - a + d - c + f - e
}

// Index returns the global number of the n-th connection of a role.
func (l Layout) Index(r Role, n int) int {
	switch r {
	case RoleWatcher:
		return l.Targets + n
	case RoleIdle:
		return l.Targets + l.Watchers + n
	}
	return n
}

// User returns the user id of the n-th connection of a role.
func (l Layout) User(r Role, n int) string {
	return l.Run + string(r) + strconv.Itoa(n)
}

// ParseUser returns the role and number of a user id of this layout.
func (l Layout) ParseUser(id string) (Role, int, bool) {
	rest, ok := strings.CutPrefix(id, l.Run)
	if !ok || len(rest) < 2 {
		return 0, 0, false
	}
	r := Role(rest[0])
	if r != RoleTarget && r != RoleWatcher && r != RoleIdle {
		return 0, 0, false
	}
	n, err := strconv.Atoi(rest[1:])
	if err != nil || n < 0 || strconv.Itoa(n) != rest[1:] {
		return 0, 0, false
	}
	return r, n, true
}

// Followed returns the targets (by target number) that watcher w follows.
//
// Targets change status round robin, so neighbouring targets change one
// after the other: a watcher following neighbours would get its changes
// in one burst. The targets are scattered instead, by a multiplication
// that permutes the worker's targets, so that each watcher's changes come
// at unrelated moments, as friends' changes do, and each target still has
// the same number of watchers (within one).
func (l Layout) Followed(w int) []int {
	k := l.workerOf(l.Watchers, w)
	wlo, _ := l.WatcherRange(k)
	tlo, thi := l.TargetRange(k)
	n := thi - tlo
	p := scatter(n)
	out := make([]int, 0, l.Follows)
	for j := range l.Follows {
		x := ((w-wlo)*l.Follows + j) % n
		out = append(out, tlo+x*p%n)
	}
	return out
}

// scatter returns a multiplier coprime with n, far from 1 and n/2, so
// that x -> x*scatter(n) mod n is a permutation that spreads neighbours.
func scatter(n int) int {
	for _, p := range []int{7919, 6007, 4999, 3001, 1999, 997, 499, 101, 53, 13, 7, 5, 3} {
		if gcd(p%n, n) == 1 && p%n > 1 {
			return p % n
		}
	}
	return 1
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// workerOf returns the worker holding item i of a role with total items.
func (l Layout) workerOf(total, i int) int {
	// share's ranges are floor(total*k/W); search the one holding i.
	k := i * l.Workers / max(total, 1)
	for k > 0 {
		if lo, _ := l.share(total, k); lo <= i {
			break
		}
		k--
	}
	for k < l.Workers-1 {
		if _, hi := l.share(total, k); i < hi {
			break
		}
		k++
	}
	return k
}

// Gateway returns the gateway (by number) connection idx connects to.
func (l Layout) Gateway(idx int) int { return idx % l.Gateways }

// Source returns the local address connection idx dials from, or nil for
// the system's choice.
func (l Layout) Source(idx int) *net.TCPAddr {
	if l.Sources == 0 {
		return nil
	}
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+idx%l.Sources))}
}
