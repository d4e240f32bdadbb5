package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/testlog"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/system/systest"
)

// The stress test's size. It runs in CI with -race on a two-core machine,
// so it is sized to pass there reliably; it is the same size under -short.
const (
	stressUsers      = 40
	stressWatchers   = 4
	stressGateways   = 2
	stressMaxDevices = 3
	// stressChurn is how long users connect, close, die and change status.
	stressChurn = 15 * time.Second

	// propagation bounds how long a status record write takes to reach a
	// watcher's socket. The protocol promises 100 ms plus the batch
	// interval; the rest is room for -race on a loaded machine.
	propagation = time.Second
	// offlineSlack is what the protocol allows beyond the TTL (a silent
	// connection) or the offline grace (a clean close) before watchers see
	// offline.
	offlineSlack = 2 * time.Second
	// confirmTimeout bounds waiting for a set_status to reach the record.
	confirmTimeout = 5 * time.Second
)

// seedEnv names the environment variable that replays a run's random
// schedule (timings still differ from run to run).
const seedEnv = "GREENDOT_STRESS_SEED"

// TestInvariant is the presence invariant under stress: many users connect
// (several devices at once, on two gateways), close cleanly, abort, die
// silently, reconnect within the grace and change status, while the reaper
// is stopped, restarted and doubled. Watchers record every presence they
// receive; afterwards each watcher's view of each user is compared with the
// test's own log of when that user's connections were live:
//
//   - no false offline: while a connection is live (a silent one until the
//     TTL after its last frame, a closed one until the offline grace after
//     its close), no watcher shows the user offline, unless the user chose
//     invisible;
//   - no stuck online: once the last connection is gone, every watcher shows
//     offline within the grace (or the TTL) plus offlineSlack, counting from
//     the reaper's return when none was running;
//   - every watcher's view, every status record and presence_conns equal the
//     truth once the churn stops, and again once everyone has disconnected.
func TestInvariant(t *testing.T) {
	tooltest.Long(t)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(seedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, v, err)
		}
	}
	t.Logf("seed %d (replay the schedule with %s=%d)", seed, seedEnv, seed)
	start := time.Now()

	s := newStress(t, seed)
	s.startWatchers()
	s.churn()
	ok := s.checkpoint("after the churn")
	s.disconnectAll()
	ok = ok && s.checkpoint("after everyone disconnected")
	s.closeWatchers()
	if ok {
		s.checkDrained()
	}
	s.waitReaders()
	// The analysis explains a failed checkpoint: it finds the first moment
	// a watcher was wrong.
	s.analyse()
	s.summary(time.Since(start))
}

// stress is one run of the stress test.
type stress struct {
	t         *testing.T
	seed      uint64
	sys       *systest.System
	gws       []*systest.Gateway
	reaperCfg reaper.Config
	ttl       time.Duration
	grace     time.Duration
	heartbeat time.Duration

	// t0 is when the watchers started watching; timelines count from it.
	t0 time.Time
	// watching is when every watcher had its presence_init.
	watching time.Time
	// churnAt is when the churn started.
	churnAt  time.Time
	users    []*user
	watchers []*watcher
	// ended is when the watchers were closed: the end of what was observed.
	ended time.Time

	stats stats

	mu      sync.Mutex
	outages []span // times when no reaper ran
	notes   []note // system events: reapers stopped and started
}

// span is a time interval [from, to); a zero to means it has not ended.
type span struct{ from, to time.Time }

func (s span) end() time.Time {
	if s.to.IsZero() {
		return farFuture
	}
	return s.to
}

// farFuture stands for "not ended".
var farFuture = time.Now().Add(24 * time.Hour)

// note is one line of a timeline.
type note struct {
	at   time.Time
	what string
}

func newStress(t *testing.T, seed uint64) *stress {
	s := &stress{
		t:         t,
		seed:      seed,
		ttl:       systest.TTL,
		grace:     systest.Grace,
		heartbeat: systest.Heartbeat,
		// Sweeps run all the time, so that they race with everything else.
		reaperCfg: reaper.Config{SweepInterval: time.Second, Logger: testlog.New(t)},
	}
	s.sys = systest.Start(t, systest.Options{Reaper: s.reaperCfg})
	s.gws = []*systest.Gateway{s.sys.Gateway()}
	for len(s.gws) < stressGateways {
		s.gws = append(s.gws, s.sys.StartGateway(gateway.Config{}))
	}
	for i := range stressUsers {
		s.users = append(s.users, &user{
			s:      s,
			id:     fmt.Sprintf("u%02d", i),
			rng:    rand.New(rand.NewPCG(seed, uint64(i))),
			chosen: presence.Online,
			counts: make(map[string]int),
		})
	}
	for i := range stressWatchers {
		s.watchers = append(s.watchers, &watcher{
			s:     s,
			id:    fmt.Sprintf("w%d", i),
			gw:    i % len(s.gws),
			views: make(map[string][]seen),
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, w := range s.watchers {
		for _, u := range s.users {
			for _, e := range [][2]string{{w.id, u.id}, {u.id, w.id}} {
				if err := s.sys.Store.Follow(ctx, e[0], e[1]); err != nil {
					t.Fatalf("follow %s -> %s: %v", e[0], e[1], err)
				}
			}
		}
	}
	s.t0 = time.Now()
	return s
}

// since formats a time as an offset from t0.
func (s *stress) since(at time.Time) string {
	if at.IsZero() {
		return "never"
	}
	if !at.Before(farFuture) {
		return "end"
	}
	return fmt.Sprintf("%+.3fs", at.Sub(s.t0).Seconds())
}

func (s *stress) note(format string, args ...any) {
	s.mu.Lock()
	s.notes = append(s.notes, note{time.Now(), fmt.Sprintf(format, args...)})
	s.mu.Unlock()
}

// churn runs every user's random schedule for stressChurn, and meanwhile
// stops, restarts and doubles the reaper.
func (s *stress) churn() {
	s.churnAt = time.Now()
	s.note("churn starts")
	until := s.churnAt.Add(stressChurn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, u := range s.users {
		wg.Go(func() { u.churn(ctx, until) })
	}
	s.reaperChaos()
	wg.Wait()
}

// reaperChaos stops the reaper twice (each removal made meanwhile must wait
// for it), and runs a second and briefly a third reaper beside it.
func (s *stress) reaperChaos() {
	at := func(d time.Duration) {
		time.Sleep(time.Until(s.churnAt.Add(d))) // pacing the schedule, not synchronisation
	}
	stopReaper := func() {
		s.note("reaper stopping")
		s.mu.Lock()
		s.outages = append(s.outages, span{from: time.Now()})
		s.mu.Unlock()
		s.sys.StopReaper()
		s.note("reaper stopped: no reaper runs")
	}
	startReaper := func() {
		s.sys.StartReaper()
		s.mu.Lock()
		s.outages[len(s.outages)-1].to = time.Now()
		s.mu.Unlock()
		s.note("reaper started")
	}

	at(2500 * time.Millisecond)
	stopReaper()
	at(5 * time.Second)
	startReaper()

	at(7 * time.Second)
	nc := natstest.Connect(s.t, s.sys.Server, nats.Name("stress second reaper"))
	second, err := reaper.New(nc, s.reaperCfg)
	if err != nil {
		s.t.Fatalf("second reaper: %v", err)
	}
	ctx, stopSecond := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- second.Run(ctx) }()
	s.note("second reaper started: two reapers run")

	at(9 * time.Second)
	s.sys.StartReaper() // replaces the first: three run for a moment
	s.note("first reaper replaced by a new one")

	at(11 * time.Second)
	stopSecond()
	select {
	case err := <-done:
		if err != nil {
			s.t.Errorf("second reaper: %v", err)
		}
	case <-time.After(30 * time.Second):
		s.t.Errorf("second reaper did not stop within 30s")
	}
	nc.Close()
	s.note("second reaper stopped")

	at(12 * time.Second)
	stopReaper()
	at(13 * time.Second)
	startReaper()
}

// expected returns what watchers should show of u and what u's record
// should say, once everything has settled.
func (u *user) expected() (public, status presence.Status, connIDs []string) {
	for _, c := range u.live {
		c.mu.Lock()
		dropped := !c.serverEnd.IsZero()
		c.mu.Unlock()
		if !dropped { // the gateway ended it: that is reported elsewhere
			connIDs = append(connIDs, c.id)
		}
	}
	if len(connIDs) == 0 {
		return presence.Offline, presence.Offline, nil
	}
	slices.Sort(connIDs)
	return u.chosen.Public(), u.chosen, connIDs
}

// checkpoint waits until every watcher shows every user as the truth says,
// and every user's status record names exactly their live connections. It
// reports the users that never got there as errors, and whether there were
// none.
func (s *stress) checkpoint(when string) bool {
	s.t.Helper()
	// Everything must have settled by the latest deadline of a connection
	// that ended, or a propagation after the latest change.
	settle := time.Now().Add(propagation)
	for _, u := range s.users {
		for _, c := range u.conns {
			if c.ended() {
				settle = later(settle, s.offlineDeadline(c))
			}
		}
		for _, w := range u.invisible {
			if !w.to.IsZero() {
				settle = later(settle, w.to.Add(propagation))
			}
		}
	}
	wait := time.Until(settle) + 500*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), wait+10*time.Second)
	defer cancel()

	var last []string
	deadline := time.Now().Add(wait)
	for {
		last = s.mismatches(ctx)
		if len(last) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling, bounded by deadline
	}
	if len(last) > 0 {
		for _, m := range last {
			s.t.Errorf("%s, %s after waiting until %s: %s", when, s.since(time.Now()), s.since(deadline), m)
		}
		s.printTimelines(last)
		return false
	}
	s.note("checkpoint: %s: every view and record is right", when)
	return true
}

// mismatches compares every watcher's view and every status record with
// the truth; each line starts with the user id.
func (s *stress) mismatches(ctx context.Context) []string {
	var out []string
	for _, u := range s.users {
		public, status, connIDs := u.expected()
		for _, w := range s.watchers {
			if !w.end().Before(farFuture) {
				continue // its socket ended: reported when the watchers close
			}
			if got := w.current(u.id); got != public {
				out = append(out, fmt.Sprintf("%s: watcher %s shows %s, want %s", u.id, w.id, got, public))
			}
		}
		rec, _, err := s.sys.Store.Status(ctx, u.id)
		if errors.Is(err, presence.ErrNotFound) {
			rec.Status = presence.Offline
		} else if err != nil {
			out = append(out, fmt.Sprintf("%s: read status record: %v", u.id, err))
			continue
		}
		var recConns []string
		for id := range rec.Conns {
			recConns = append(recConns, id)
		}
		slices.Sort(recConns)
		if rec.Status != status || rec.Devices != len(connIDs) || !slices.Equal(recConns, connIDs) {
			out = append(out, fmt.Sprintf("%s: status record says %s with %d devices, connections %v; want %s with %d, connections %v",
				u.id, rec.Status, rec.Devices, recConns, status, len(connIDs), connIDs))
		}
	}
	return out
}

// disconnectAll ends every user's live connections: most cleanly, some by
// dropping the TCP connection.
func (s *stress) disconnectAll() {
	s.note("everyone disconnects")
	for _, u := range s.users {
		for len(u.live) > 0 {
			kind := endClose
			if u.rng.IntN(4) == 0 {
				kind = endAbort
			}
			u.end(u.live[0], kind)
		}
	}
}

// closeWatchers closes the watchers' sockets; what they saw is final.
func (s *stress) closeWatchers() {
	s.ended = time.Now()
	for _, w := range s.watchers {
		w.closing.Store(true)
		w.stopHB()
		if err := w.c.Close(); err != nil {
			s.t.Errorf("close watcher %s: %v", w.id, err)
		}
	}
	for _, w := range s.watchers {
		select {
		case <-w.readDone:
		case <-time.After(10 * time.Second):
			s.t.Fatalf("watcher %s: reader did not stop", w.id)
		}
		if len(w.problems) > 0 {
			for _, p := range w.problems {
				s.t.Errorf("watcher %s: %s", w.id, p)
			}
		}
	}
}

// checkDrained waits until, with every socket closed, every status record
// says offline with no connection and presence_conns holds no key.
func (s *stress) checkDrained() {
	s.t.Helper()
	ids := make([]string, 0, len(s.users)+len(s.watchers))
	for _, u := range s.users {
		ids = append(ids, u.id)
	}
	for _, w := range s.watchers {
		ids = append(ids, w.id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	natstest.CheckFor(s.t, s.grace+offlineSlack+time.Second, 50*time.Millisecond, func() error {
		for _, id := range ids {
			rec, _, err := s.sys.Store.Status(ctx, id)
			if errors.Is(err, presence.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if rec.Status != presence.Offline || rec.Public != presence.Offline || len(rec.Conns) != 0 || rec.Devices != 0 {
				return fmt.Errorf("status record of %s: %s (public %s), %d devices, connections %v",
					id, rec.Status, rec.Public, rec.Devices, rec.Conns)
			}
		}
		var keys []string
		err := s.sys.Store.ScanConns(ctx, func(userID, connID string, _ presence.ConnRecord, _ uint64) error {
			keys = append(keys, presence.ConnKey(userID, connID))
			return nil
		})
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			return fmt.Errorf("%s still holds %d keys: %v", presence.ConnsBucket, len(keys), keys)
		}
		return nil
	})
}

// waitReaders waits until every client connection's reader has stopped:
// the gateway has closed every silent connection.
func (s *stress) waitReaders() {
	s.t.Helper()
	deadline := time.After(10 * time.Second)
	for _, u := range s.users {
		for _, c := range u.conns {
			select {
			case <-c.readDone:
			case <-deadline:
				s.t.Fatalf("%s connection #%d (%s): the socket is still open", u.id, c.n, c.id)
			}
		}
	}
}

// user is one user's random schedule and the log of what it did. Only the
// user's own goroutine touches it while the churn runs.
type user struct {
	s      *stress
	id     string
	rng    *rand.Rand
	chosen presence.Status
	// conns holds every connection, in the order they were dialled; live
	// those still sending heartbeats.
	conns []*conn
	live  []*conn
	// invisible holds the times the user chose invisible: from sending
	// set_status invisible to another status reaching the record.
	invisible []span
	notes     []note
	problems  []string
	counts    map[string]int
}

func (u *user) note(format string, args ...any) {
	u.notes = append(u.notes, note{time.Now(), fmt.Sprintf(format, args...)})
}

func (u *user) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	u.problems = append(u.problems, fmt.Sprintf("%s: %s", u.s.since(time.Now()), msg))
	u.note("PROBLEM: %s", msg)
}

// pause lets time pass: the schedule holds a state for d.
func (u *user) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (u *user) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(u.rng.Int64N(int64(hi-lo)))
}

// churn runs the user's random schedule until the time is up. A user with
// no live connection stays away for a while, sometimes long enough for
// watchers to have to see them offline. Users start over the first two
// seconds, as people do, rather than all at once.
func (u *user) churn(ctx context.Context, until time.Time) {
	u.pause(ctx, u.between(0, 2*time.Second))
	for time.Now().Before(until) && ctx.Err() == nil {
		u.prune()
		if len(u.live) == 0 {
			if len(u.conns) > 0 {
				u.pause(ctx, u.between(200*time.Millisecond, 5*time.Second))
			}
			if time.Now().Before(until) {
				u.connect(ctx)
			}
			continue
		}
		switch r := u.rng.IntN(100); {
		case r < 18:
			if len(u.live) < stressMaxDevices {
				u.connect(ctx)
			} else {
				u.setStatus(ctx)
			}
		case r < 32:
			u.end(u.pick(), endClose)
		case r < 42:
			u.end(u.pick(), endAbort)
		case r < 52:
			u.end(u.pick(), endSilent)
		case r < 66:
			// A page reload: the socket closes and a new one follows
			// within the offline grace.
			kind := endClose
			if u.rng.IntN(3) == 0 {
				kind = endAbort
			}
			u.counts["reload"]++
			u.end(u.pick(), kind)
			u.pause(ctx, u.between(0, 400*time.Millisecond))
			u.connect(ctx)
		case r < 82:
			u.setStatus(ctx)
		default:
			// Hold the current state.
		}
		u.pause(ctx, u.between(100*time.Millisecond, 700*time.Millisecond))
	}
}

func (u *user) pick() *conn { return u.live[u.rng.IntN(len(u.live))] }

// prune forgets live connections the gateway ended (the analysis reports
// them), so that the schedule goes on with those that are left.
func (u *user) prune() {
	u.live = slices.DeleteFunc(u.live, func(c *conn) bool {
		select {
		case <-c.readDone:
			close(c.stopHB)
			<-c.hbDone
			u.note("#%d is gone: the gateway ended it", c.n)
			return true
		default:
			return false
		}
	})
}

var devices = []string{"web", "ios", "android", "desktop"}

// connect dials a random gateway and starts the connection's reader and
// heartbeats.
func (u *user) connect(ctx context.Context) {
	u.counts["connect"]++
	c := &conn{
		u:        u,
		n:        len(u.conns) + 1,
		gw:       u.rng.IntN(len(u.s.gws)),
		device:   devices[u.rng.IntN(len(devices))],
		stopHB:   make(chan struct{}),
		hbDone:   make(chan struct{}),
		readDone: make(chan struct{}),
	}
	c.dialAt = time.Now()
	c.lastSend = c.dialAt
	u.note("#%d dials gateway %d (%s)", c.n, c.gw, c.device)
	url := u.s.gws[c.gw].WS + "?user=" + u.id + "&device=" + c.device
	cl, err := client.Dial(ctx, url, client.Options{Timeout: 10 * time.Second})
	if err != nil {
		u.problem("#%d: dial gateway %d: %v", c.n, c.gw, err)
		return
	}
	c.helloAt = time.Now()
	c.c, c.id = cl, cl.Hello.ConnID
	u.note("#%d hello: conn %s, status %s", c.n, c.id, cl.Hello.Status)
	if cl.Hello.Status != u.chosen {
		u.problem("#%d: hello says status %s, but the user chose %s", c.n, cl.Hello.Status, u.chosen)
	}
	u.conns = append(u.conns, c)
	u.live = append(u.live, c)
	go c.read()
	go c.heartbeats(u.s.heartbeat)
}

// end ends a live connection: a clean close, a dropped TCP connection, or
// silence (no more frames, the socket left open for the gateway to end).
func (u *user) end(c *conn, kind endKind) {
	u.counts[kind.String()]++
	u.live = slices.DeleteFunc(u.live, func(x *conn) bool { return x == c })
	close(c.stopHB)
	<-c.hbDone
	c.mu.Lock()
	c.kind, c.endAt = kind, time.Now()
	c.mu.Unlock()
	u.note("#%d %s", c.n, kind.verb())
	switch kind {
	case endClose:
		_ = c.c.Close()
	case endAbort:
		_ = c.c.Abort()
	}
}

// setStatus chooses a new status on a random live connection and waits
// until the user's record has it, so the truth knows when it changed.
func (u *user) setStatus(ctx context.Context) {
	choices := []presence.Status{presence.Online, presence.Online, presence.Away, presence.Busy, presence.Busy, presence.Invisible}
	st := choices[u.rng.IntN(len(choices))]
	if st == u.chosen {
		return
	}
	u.counts["set_status"]++
	c := u.pick()
	sent := time.Now()
	if st == presence.Invisible {
		u.invisible = append(u.invisible, span{from: sent})
	}
	c.mu.Lock()
	c.lastSend = sent
	c.mu.Unlock()
	u.note("#%d set_status %s", c.n, st)
	if err := c.c.SetStatus(string(st)); err != nil {
		u.problem("#%d: send set_status: %v", c.n, err)
		return
	}
	deadline := sent.Add(confirmTimeout)
	for {
		rec, _, err := u.s.sys.Store.Status(ctx, u.id)
		if err == nil && rec.ChosenStatus() == st {
			break
		}
		if time.Now().After(deadline) {
			u.problem("set_status %s did not reach the status record within %v (last read: %s, %v)", st, confirmTimeout, rec.ChosenStatus(), err)
			return
		}
		u.pause(ctx, 5*time.Millisecond) // polling, bounded by deadline
	}
	if u.chosen == presence.Invisible {
		u.invisible[len(u.invisible)-1].to = time.Now()
	}
	u.note("status %s is in the record", st)
	u.chosen = st
}

// endKind says how the test ended a connection.
type endKind uint8

const (
	endNone   endKind = iota // live
	endClose                 // close frame, then TCP close
	endAbort                 // TCP close, no close frame
	endSilent                // no more frames; the gateway must end it
)

func (k endKind) String() string {
	return [...]string{"live", "close", "abort", "silent"}[k]
}

func (k endKind) verb() string {
	return [...]string{"is live", "closes cleanly", "aborts (TCP close, no close frame)", "goes silent (no more frames, socket left open)"}[k]
}

// conn is one client connection of a user.
type conn struct {
	u        *user
	n        int // the user's connection number, from 1
	gw       int
	device   string
	id       string
	c        *client.Conn
	dialAt   time.Time
	helloAt  time.Time
	stopHB   chan struct{}
	hbDone   chan struct{}
	readDone chan struct{}

	mu sync.Mutex
	// lastSend is when the newest frame was sent (the dial, before any).
	lastSend time.Time
	kind     endKind
	endAt    time.Time
	// serverEnd is when the gateway ended the socket (it was not the test).
	serverEnd time.Time
	serverErr error
	frames    []string // frames nothing should have caused
}

func (c *conn) ended() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kind != endNone || !c.serverEnd.IsZero()
}

// heartbeats sends a heartbeat at once and then every interval, until
// stopHB is closed. The first one goes at once because the gateway counts
// a connection's TTL from before its upgrade is answered, so a slow
// upgrade would otherwise eat into it.
func (c *conn) heartbeats(every time.Duration) {
	defer close(c.hbDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-c.stopHB:
				return
			case <-t.C:
			}
		}
		c.mu.Lock()
		c.lastSend = time.Now()
		c.mu.Unlock()
		if err := c.c.Heartbeat(); err != nil {
			return // the reader reports how the socket ended
		}
	}
}

// read reads frames until the socket ends, and notes an end the test did
// not cause.
func (c *conn) read() {
	defer close(c.readDone)
	for {
		m, raw, err := c.c.Read()
		if err != nil {
			now := time.Now()
			c.mu.Lock()
			if c.kind == endNone || c.kind == endSilent {
				c.serverEnd, c.serverErr = now, err
			}
			c.mu.Unlock()
			return
		}
		if m.Type == protocol.TypeError || m.Type == protocol.TypeDenied {
			c.mu.Lock()
			c.frames = append(c.frames, string(raw))
			c.mu.Unlock()
		}
	}
}

// watcher is a user who follows every churning user, and records every
// presence its socket is told.
type watcher struct {
	s        *stress
	id       string
	gw       int
	c        *client.Conn
	stopHB   func()
	readDone chan struct{}
	// closing is set before the test closes the socket.
	closing atomic.Bool

	mu       sync.Mutex
	views    map[string][]seen // per user, in the order received
	problems []string
	// endedAt is when the gateway ended the watcher's socket, if it did.
	endedAt time.Time
}

// end is when the watcher stopped hearing anything: the end of its socket
// if the gateway ended it, else farFuture.
func (w *watcher) end() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.endedAt.IsZero() {
		return farFuture
	}
	return w.endedAt
}

// seen is one presence a watcher was told.
type seen struct {
	at     time.Time
	status presence.Status
}

// startWatchers connects the watchers, subscribes each to every user, and
// checks that they start out seeing everyone offline.
func (s *stress) startWatchers() {
	s.t.Helper()
	ids := make([]string, len(s.users))
	for i, u := range s.users {
		ids[i] = u.id
	}
	for _, w := range s.watchers {
		w.c = s.sys.Dial(s.gws[w.gw], w.id, "desktop")
		w.stopHB = systest.KeepAlive(w.c, s.heartbeat)
		if err := w.c.Subscribe("all-users", ids...); err != nil {
			s.t.Fatalf("watcher %s: subscribe: %v", w.id, err)
		}
		init := systest.Await(s.t, w.c, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool {
			return m.Type == protocol.TypePresenceInit || m.Type == protocol.TypeDenied || m.Type == protocol.TypeError
		})
		if init.Type != protocol.TypePresenceInit || len(init.Users) != len(ids) {
			s.t.Fatalf("watcher %s: subscribe answered %+v", w.id, init)
		}
		now := time.Now()
		for _, p := range init.Users {
			if p.Status != presence.Offline {
				s.t.Fatalf("watcher %s: %s is %s before anyone connected", w.id, p.UserID, p.Status)
			}
			w.views[p.UserID] = []seen{{now, p.Status}}
		}
		w.readDone = make(chan struct{})
		go w.read()
	}
	s.watching = time.Now()
}

// read records every presence the watcher is told, until its socket ends.
func (w *watcher) read() {
	defer close(w.readDone)
	for {
		m, raw, err := w.c.Read()
		now := time.Now()
		if err != nil {
			if !w.closing.Load() {
				w.mu.Lock()
				w.endedAt = now
				w.problems = append(w.problems, fmt.Sprintf("socket ended at %s: %v", w.s.since(now), err))
				w.mu.Unlock()
			}
			return
		}
		var list []presence.Presence
		switch m.Type {
		case protocol.TypePresenceBatch:
			list = m.Updates
		case protocol.TypePresenceInit:
			list = m.Users
		case protocol.TypeSelf:
			continue
		default:
			w.mu.Lock()
			w.problems = append(w.problems, fmt.Sprintf("unexpected frame at %s: %s", w.s.since(now), raw))
			w.mu.Unlock()
			continue
		}
		w.mu.Lock()
		for _, p := range list {
			w.views[p.UserID] = append(w.views[p.UserID], seen{now, p.Status})
		}
		w.mu.Unlock()
	}
}

// current returns the newest status the watcher was told of a user.
func (w *watcher) current(userID string) presence.Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := w.views[userID]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1].status
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
