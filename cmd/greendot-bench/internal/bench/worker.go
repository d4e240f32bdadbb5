package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// Limits of a worker's own loops.
const (
	// subscribeChunk is how many ids one subscribe message carries: the
	// gateway's default per-message limit.
	subscribeChunk = 100
	// writeTimeout bounds one write to a socket.
	writeTimeout = 5 * time.Second
	// closeWait bounds the wait for the gateway's answer to a close frame.
	closeWait = 5 * time.Second
	// heartbeatTick is how often the heartbeat loop wakes; each tick sends
	// the heartbeats of one slice of the connections.
	heartbeatTick = 100 * time.Millisecond
	// heartbeatSenders is how many goroutines write heartbeats.
	heartbeatSenders = 8
	// pollEvery is how often a waiting command checks its condition.
	pollEvery = 20 * time.Millisecond
	// maxCommandTime bounds any command, whatever it asks for.
	maxCommandTime = 30 * time.Minute
)

// The phases of a worker decide what a lost connection or an offline
// presence means.
const (
	phaseHold int32 = iota
	phasePropagate
	phaseDeath
	phaseStorm
	phaseRoomChurn
	phaseTyping
	phaseEnd
)

// measure enters phase, in which what is seen is timed into lat, and
// returns the function that ends it: back to holding, timing nothing.
func (w *worker) measure(phase int32, lat *hist) (end func()) {
	w.latency.Store(lat)
	w.phase.Store(phase)
	return func() {
		w.phase.Store(phaseHold)
		w.latency.Store(nil)
	}
}

// statusCycle is the order in which targets change status: each change is
// identified by its status among the last len(statusCycle) changes.
var statusCycle = [...]presence.Status{presence.Busy, presence.Away, presence.Online}

// RunWorker runs a worker: it reads Commands as JSON lines from in and
// answers each with one Reply line on out, until OpClose, the end of in, or
// ctx is canceled. It owns every connection it makes and closes them all
// before it returns. A failed command is answered with Reply.Err; RunWorker
// returns an error only when it cannot read commands or write replies.
func RunWorker(ctx context.Context, in io.Reader, out io.Writer) error {
	w := &worker{ctx: ctx, errs: &errSamples{}}
	defer w.shutdown()
	cmds := make(chan Command)
	readErr := make(chan error, 1)
	go func() {
		dec := json.NewDecoder(in)
		for {
			var cmd Command
			if err := dec.Decode(&cmd); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				readErr <- err
				return
			}
			select {
			case cmds <- cmd:
			case <-ctx.Done():
				readErr <- nil
				return
			}
		}
	}()
	enc := json.NewEncoder(out)
	for {
		var cmd Command
		select {
		case <-ctx.Done():
			return nil
		case err := <-readErr:
			if err != nil {
				return fmt.Errorf("read command: %w", err)
			}
			return nil
		case cmd = <-cmds:
		}
		r := w.handle(cmd)
		r.Op, r.Worker = cmd.Op, w.setup.Worker
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("write reply: %w", err)
		}
		if cmd.Op == OpClose {
			return nil
		}
	}
}

// worker holds the connections of one worker and the state of the command
// in progress.
type worker struct {
	ctx   context.Context
	setup Setup
	l     Layout
	ready bool

	conns    []*vconn // every connection, in layout order
	targets  []*vconn // by target number - tlo
	tlo      int
	watchers []*vconn
	// watchersOf counts the watchers of each local target.
	watchersOf []int
	sent       []sentLog // by target number - tlo

	ttl        atomic.Int64 // the gateways' connection TTL (ns), from hello
	hbInterval atomic.Int64 // the heartbeat interval (ns), from hello
	phase      atomic.Int32
	hbStop     chan struct{}
	hbDone     sync.WaitGroup
	readers    sync.WaitGroup // one per live connection until it ends

	// The poller reading the sockets, started on first use; noPoll once
	// it could not be.
	pollMu sync.Mutex
	poll   *poller
	noPoll bool
	// polledConns counts the connections attached to the poller.
	polledConns atomic.Int64

	// Counters and histograms of the command in progress.
	errs *errSamples
	// suspects are offline events seen for a target while it had a
	// connection, guarded by smu.
	suspects     []suspect
	offlineSeen  atomic.Int64 // offline seen during a storm
	deliveries   atomic.Int64 // changes seen by watchers (propagate)
	stale        atomic.Int64 // changes whose send could not be found
	deadSeen     atomic.Int64 // offline seen for a silenced target (death)
	unexpected   atomic.Int64 // connections lost when nothing should close them
	denied       atomic.Int64 // denied frames
	serverErrors atomic.Int64 // error frames
	latency      atomic.Pointer[hist]
	// delivered, while set, logs each change seen by a watcher
	// (propagate) or signal seen by a member (typing), to be told apart
	// by the machine's slow spans.
	delivered atomic.Pointer[deliveryLog]

	// Rooms state: the plan of the rooms scenario in progress, and what
	// its members were shown.
	rooms       roomsState
	truncated   atomic.Int64 // room_state frames that were truncated
	leavesSeen  atomic.Int64 // churners' leaves seen in room_diff
	joinsSeen   atomic.Int64 // churners' joins seen in room_diff
	signalsSeen atomic.Int64 // typing signals seen

	// Storm state. smu orders starting a reconnection with the end of
	// the run.
	smu           sync.Mutex
	stormGW       map[int]bool
	stormEnd      time.Time
	stormJitter   time.Duration
	stormExpected int64
	reconnected   atomic.Int64
	attempts      atomic.Int64
	lastHello     atomic.Int64
	firstDown     atomic.Int64
	reconnHist    *hist
	reconnWG      sync.WaitGroup
}

// vconn is one connection of the layout, across reconnections.
type vconn struct {
	role    Role
	n       int // number within its role
	idx     int // global number
	user    string
	gw      int
	follows []int // watchers: the target numbers followed

	mu       sync.Mutex
	cur      *live // nil while disconnected
	silent   bool  // death: no more heartbeats
	lastSent int64 // unix ns of the newest frame sent
	deadline int64 // death: when the gateway may first call it dead
	down     int64 // storm: unix ns when the connection was lost
	storm    bool  // storm: expected to be closed and reconnected
	busy     atomic.Bool

	vmu      sync.Mutex
	view     map[int]presence.Status // watchers: newest status of each target
	seenDead map[int]bool

	inits chan subAnswer

	// Rooms: the room it joins ("" for none), the answers to its joins,
	// their number, and the member count it was last shown.
	room     string
	roomAns  chan subAnswer
	joinSeq  atomic.Int32
	shownCnt atomic.Int32
}

// live is one WebSocket of a vconn.
type live struct {
	c    *client.Conn
	done chan struct{} // closed when its reader returns
	// lost is set when the connection ended without this worker closing
	// it: the gateway closed it, or it broke.
	lost atomic.Bool
	// How it is read, when through the worker's poller.
	polled
}

// suspect is an offline event a watcher saw while the target had a
// connection: false, unless that connection turns out to have been lost.
type suspect struct {
	l               *live
	watcher, target string
}

// subAnswer is a gateway's answer to a subscribe.
type subAnswer struct {
	id  string
	err string
}

// sentLog remembers a target's last status changes: as statuses cycle
// through statusCycle, the status a watcher sees names the change.
type sentLog struct {
	mu     sync.Mutex
	at     [len(statusCycle)]int64
	status [len(statusCycle)]presence.Status
	next   int
	cur    presence.Status // the newest status chosen; empty for online
}

func (s *sentLog) record(st presence.Status, at int64) {
	s.mu.Lock()
	s.at[s.next], s.status[s.next] = at, st
	s.next = (s.next + 1) % len(s.at)
	s.cur = st
	s.mu.Unlock()
}

// sentAt returns when the newest change to st was sent.
func (s *sentLog) sentAt(st presence.Status) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.at {
		if s.status[i] == st && s.at[i] != 0 {
			return s.at[i], true
		}
	}
	return 0, false
}

func (s *sentLog) current() presence.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == "" {
		return presence.Online
	}
	return s.cur
}

// errSamples counts errors and keeps a few distinct examples.
type errSamples struct {
	mu   sync.Mutex
	list []string
}

func (e *errSamples) add(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.list) >= 5 {
		return
	}
	for _, m := range e.list {
		if m == msg {
			return
		}
	}
	e.list = append(e.list, msg)
}

func (e *errSamples) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.list
	e.list = nil
	return out
}

// handle runs one command.
func (w *worker) handle(cmd Command) Reply {
	if cmd.Op != OpSetup && cmd.Op != OpClose && !w.ready {
		return Reply{Err: "the first command must be setup"}
	}
	timeout := min(cmd.Timeout, maxCommandTime)
	switch cmd.Op {
	case OpSetup:
		if w.ready {
			return Reply{Err: "setup was already given"}
		}
		if cmd.Setup == nil {
			return Reply{Err: "setup without a setup"}
		}
		if err := w.init(*cmd.Setup); err != nil {
			return Reply{Err: err.Error()}
		}
		return Reply{Counts: map[string]int64{"conns": int64(len(w.conns))}}
	case OpConnect:
		return w.connect()
	case OpSubscribe:
		return w.subscribe(timeout)
	case OpPropagate:
		return w.propagate(cmd.Rate, min(cmd.Duration, maxCommandTime), timeout)
	case OpDeath:
		return w.death(timeout)
	case OpChurn:
		return w.churn(cmd.Rate, min(cmd.Duration, maxCommandTime), timeout)
	case OpStorm:
		return w.storm(cmd.Gateways, cmd.Jitter, timeout)
	case OpStormWait:
		return w.stormWait()
	case OpJoin, OpRoomChurn, OpTyping:
		if cmd.Room == nil {
			return Reply{Err: cmd.Op + " without a room plan"}
		}
		if err := w.setRooms(*cmd.Room); err != nil {
			return Reply{Err: err.Error()}
		}
		switch cmd.Op {
		case OpJoin:
			return w.join(cmd.Group, timeout)
		case OpRoomChurn:
			return w.roomChurn(timeout)
		}
		return w.typing(min(cmd.Duration, maxCommandTime), timeout)
	case OpEnd:
		r := w.reply(nil, nil)
		w.smu.Lock()
		w.phase.Store(phaseEnd)
		w.smu.Unlock()
		return r
	case OpClose:
		w.shutdown()
		return Reply{}
	}
	return Reply{Err: fmt.Sprintf("unknown command %q", cmd.Op)}
}

// init places the worker's connections.
func (w *worker) init(s Setup) error {
	if err := s.Layout.Validate(); err != nil {
		return err
	}
	l := s.Layout
	switch {
	case s.Worker < 0 || s.Worker >= l.Workers:
		return fmt.Errorf("%w: worker %d of %d", ErrInvalidConfig, s.Worker, l.Workers)
	case len(s.URLs) != l.Gateways:
		return fmt.Errorf("%w: %d gateway URLs for %d gateways", ErrInvalidConfig, len(s.URLs), l.Gateways)
	case s.ConnectConcurrency < 1 || s.DialTimeout <= 0 || s.ConnectRate < 0:
		return fmt.Errorf("%w: connect concurrency, dial timeout and rate", ErrInvalidConfig)
	}
	for _, u := range s.URLs {
		if p, err := url.Parse(u); err != nil || p.Scheme != "ws" && p.Scheme != "wss" {
			return fmt.Errorf("%w: gateway URL %q: want ws://host:port/ws", ErrInvalidConfig, u)
		}
	}
	w.setup, w.l = s, l
	add := func(r Role, n int) *vconn {
		v := &vconn{role: r, n: n, idx: l.Index(r, n), user: l.User(r, n)}
		v.gw = l.Gateway(v.idx)
		w.conns = append(w.conns, v)
		return v
	}
	lo, hi := l.TargetRange(s.Worker)
	w.tlo = lo
	w.watchersOf = make([]int, hi-lo)
	w.sent = make([]sentLog, hi-lo)
	for t := lo; t < hi; t++ {
		w.targets = append(w.targets, add(RoleTarget, t))
	}
	lo, hi = l.WatcherRange(s.Worker)
	for n := lo; n < hi; n++ {
		v := add(RoleWatcher, n)
		v.follows = l.Followed(n)
		v.view = make(map[int]presence.Status, len(v.follows))
		v.seenDead = make(map[int]bool)
		v.inits = make(chan subAnswer, 8)
		for _, t := range v.follows {
			w.watchersOf[t-w.tlo]++
		}
		w.watchers = append(w.watchers, v)
	}
	lo, hi = l.IdleRange(s.Worker)
	for n := lo; n < hi; n++ {
		add(RoleIdle, n)
	}
	w.ttl.Store(int64(30 * time.Second))
	w.hbInterval.Store(int64(15 * time.Second))
	w.ready = true
	return nil
}

// target returns the local target with number t, or nil.
func (w *worker) target(t int) *vconn {
	i := t - w.tlo
	if i < 0 || i >= len(w.targets) {
		return nil
	}
	return w.targets[i]
}

// dial opens a new WebSocket for v, not yet attached.
func (w *worker) dial(v *vconn) (*client.Conn, error) {
	u := w.setup.URLs[v.gw] + "?user=" + v.user + "&device=bench"
	o := client.Options{Timeout: w.setup.DialTimeout, Compression: w.setup.Compression}
	if src := w.l.Source(v.idx); src != nil {
		o.LocalAddr = src
	}
	c, err := client.Dial(w.ctx, u, o)
	if err != nil {
		return nil, err
	}
	if ms := c.Hello.HeartbeatIntervalMS; ms > 0 {
		w.hbInterval.Store(ms * int64(time.Millisecond))
	}
	if ms := c.Hello.TTLMS; ms > 0 {
		w.ttl.Store(ms * int64(time.Millisecond))
	}
	// What the worker needs of the hello is read: its strings need not
	// stay for as long as the connection.
	c.Hello = protocol.ServerMessage{}
	return c, nil
}

// attach makes c v's connection and starts reading it: through the
// worker's poller when it can, else with a goroutine. It returns the
// connection it replaces, if any.
func (w *worker) attach(v *vconn, c *client.Conn) *live {
	l := &live{c: c, done: make(chan struct{})}
	var rest []byte
	p := w.pollerFor()
	if p != nil {
		var ok bool
		if rest, ok = p.takeSocket(l, v); !ok {
			p = nil
		}
	}
	v.mu.Lock()
	old := v.cur
	v.cur, v.down = l, 0
	v.lastSent = time.Now().UnixNano()
	v.mu.Unlock()
	w.readers.Add(1)
	if p == nil {
		go w.read(v, l)
		return old
	}
	w.polledConns.Add(1)
	p.start(l, rest)
	return old
}

// read reads l with a goroutine of its own until it fails, handling what
// watchers are told: where the socket is not read through the poller.
func (w *worker) read(v *vconn, l *live) {
	defer w.readers.Done()
	defer close(l.done)
	for {
		m, _, err := l.c.Read()
		if err != nil {
			w.lost(v, l, err)
			return
		}
		w.message(v, &m, time.Now().UnixNano())
	}
}

// message handles a message v was sent, read at now.
func (w *worker) message(v *vconn, m *protocol.ServerMessage, now int64) {
	switch m.Type {
	case protocol.TypePresenceInit:
		w.observe(v, m.Users, now, true)
		if m.ID != "" && v.inits != nil {
			select {
			case v.inits <- subAnswer{id: m.ID}:
			default:
			}
		}
	case protocol.TypePresenceBatch:
		w.observe(v, m.Updates, now, false)
	case protocol.TypeDenied:
		w.denied.Add(1)
		w.errs.add("denied %s: %s", m.UserID, m.Reason)
	case protocol.TypeError:
		w.serverErrors.Add(1)
		w.errs.add("error frame: %s: %s", m.Code, m.Message)
		if m.ID != "" && v.inits != nil {
			select {
			case v.inits <- subAnswer{id: m.ID, err: m.Code + ": " + m.Message}:
			default:
			}
		}
		if m.ID != "" {
			w.answerJoin(v, m.ID, m.Code+": "+m.Message)
		}
	case protocol.TypeRoomState, protocol.TypeRoomDiff, protocol.TypeRoomSignal, protocol.TypeRoomDenied:
		w.roomFrame(v, m, now)
	}
}

// lost handles the end of a connection's reading.
func (w *worker) lost(v *vconn, l *live, err error) {
	v.mu.Lock()
	if v.cur != l {
		// Replaced (churn) or closed by the worker: whoever did it closes.
		v.mu.Unlock()
		return
	}
	now := time.Now().UnixNano()
	l.lost.Store(true)
	v.cur, v.down = nil, now
	storm := v.storm
	v.storm = false
	v.mu.Unlock()
	_ = l.c.Abort()
	w.smu.Lock()
	defer w.smu.Unlock()
	switch phase := w.phase.Load(); {
	case phase == phaseEnd:
	case phase == phaseStorm && storm:
		w.firstDownAt(now)
		w.reconnWG.Add(1)
		go w.reconnect(v, now)
	case phase == phaseDeath && v.role == RoleTarget:
	default:
		w.unexpected.Add(1)
		w.errs.add("%s lost its connection: %v", v.user, err)
	}
}

func (w *worker) firstDownAt(now int64) {
	for {
		cur := w.firstDown.Load()
		if cur != 0 && cur <= now || w.firstDown.CompareAndSwap(cur, now) {
			return
		}
	}
}

// observe takes presence objects a watcher was sent.
func (w *worker) observe(v *vconn, list []presence.Presence, now int64, init bool) {
	if v.role != RoleWatcher {
		return
	}
	phase := w.phase.Load()
	for _, p := range list {
		r, t, ok := w.l.ParseUser(p.UserID)
		if !ok || r != RoleTarget {
			continue
		}
		tv := w.target(t)
		if tv == nil {
			w.errs.add("%s was sent %s, which it does not follow", v.user, p.UserID)
			continue
		}
		v.vmu.Lock()
		prev, had := v.view[t]
		v.view[t] = p.Status
		firstDead := false
		if p.Status == presence.Offline && phase == phaseDeath && !v.seenDead[t] {
			v.seenDead[t] = true
			firstDead = true
		}
		v.vmu.Unlock()

		if p.Status == presence.Offline {
			switch {
			case phase == phaseEnd:
			case phase == phaseStorm:
				w.offlineSeen.Add(1)
			case phase == phaseDeath:
				if firstDead {
					tv.mu.Lock()
					deadline := tv.deadline
					tv.mu.Unlock()
					if deadline != 0 {
						w.deadSeen.Add(1)
						if h := w.latency.Load(); h != nil {
							h.record(time.Duration(now - deadline))
						}
					}
				}
			default:
				tv.mu.Lock()
				l := tv.cur
				tv.mu.Unlock()
				if l != nil {
					// Judged when the command ends: if the gateway closed
					// this connection, it may have done so before the
					// offline, and this worker, busy, noticed later.
					w.smu.Lock()
					w.suspects = append(w.suspects, suspect{l: l, watcher: v.user, target: p.UserID})
					w.smu.Unlock()
				}
			}
			continue
		}
		if phase != phasePropagate || init || had && prev == p.Status {
			continue
		}
		at, ok := w.sent[t-w.tlo].sentAt(p.Status)
		if !ok || now < at {
			w.stale.Add(1)
			continue
		}
		w.deliveries.Add(1)
		w.seenAt(at, now)
	}
}

// seenAt counts a delivery sent at sent and seen at seen (unix ns) in the
// measured phase's latency, and logs it for the speed probe's reckoning
// (watchSpeed), where each is set.
func (w *worker) seenAt(sent, seen int64) {
	if h := w.latency.Load(); h != nil {
		h.record(time.Duration(seen - sent))
	}
	if l := w.delivered.Load(); l != nil {
		l.add(sent, seen)
	}
}

// send writes one frame on v's connection with a write deadline, and
// notes when. It reports false when v has no connection or is silent.
func (w *worker) send(v *vconn, fn func(c *client.Conn) error) (bool, error) {
	v.mu.Lock()
	l := v.cur
	if l == nil || v.silent {
		v.mu.Unlock()
		return false, nil
	}
	v.lastSent = time.Now().UnixNano()
	v.mu.Unlock()
	_ = l.c.NetConn().SetWriteDeadline(time.Now().Add(writeTimeout))
	return true, fn(l.c)
}

// startHeartbeats starts the loop that sends every connection's
// heartbeats, spread evenly over the heartbeat interval. The schedule
// follows the clock, not the ticks: ticks a busy machine delays or drops
// are caught up, so no connection goes a TTL without a heartbeat because
// the worker was starved. A few senders write, so that one socket whose
// buffer is full delays only its own heartbeat.
func (w *worker) startHeartbeats() {
	if w.hbStop != nil {
		return
	}
	w.hbStop = make(chan struct{})
	queue := make(chan *vconn, 1024)
	for range heartbeatSenders {
		w.hbDone.Go(func() {
			for v := range queue {
				// A connection closed meanwhile (churn, storm) is not an
				// error of the heartbeat.
				if _, err := w.send(v, (*client.Conn).Heartbeat); err != nil && !errors.Is(err, net.ErrClosed) {
					w.errs.add("heartbeat of %s: %v", v.user, err)
				}
			}
		})
	}
	w.hbDone.Go(func() {
		defer close(queue)
		t := time.NewTicker(heartbeatTick)
		defer t.Stop()
		start := time.Now()
		sent := 0 // slices sent since start
		for {
			select {
			case <-w.hbStop:
				return
			case <-w.ctx.Done():
				return
			case <-t.C:
			}
			interval := time.Duration(w.hbInterval.Load())
			slices := max(1, int(interval/heartbeatTick))
			due := int(time.Since(start)/(interval/time.Duration(slices))) + 1
			sent = max(sent, due-slices) // at most one whole round behind
			for ; sent < due; sent++ {
				for i := sent % slices; i < len(w.conns); i += slices {
					select {
					case queue <- w.conns[i]:
					case <-w.hbStop:
						return
					}
				}
			}
		}
	})
}

// pace calls fn(i) for i = 0, 1, ... at rate per second, none before it
// is due, until the next is due d after now, count calls were made (when
// count >= 0), or ctx ends, and records how late each call started in
// lag. It returns the calls made.
func (w *worker) pace(rate float64, d time.Duration, count int, lag *hist, fn func(i int)) int {
	return w.paceFrom(time.Now(), rate, d, count, lag, fn)
}

// paceFrom is pace on a schedule that starts at start, which may be in
// the past (its calls then start at once, late) or in the future.
func (w *worker) paceFrom(start time.Time, rate float64, d time.Duration, count int, lag *hist, fn func(i int)) int {
	if rate <= 0 {
		return 0
	}
	end := start.Add(d)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	n := 0
	for i := 0; count < 0 || i < count; i++ {
		due := start.Add(time.Duration(float64(i) * float64(time.Second) / rate))
		if !due.Before(end) {
			return n
		}
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-w.ctx.Done():
				return n
			}
		}
		if lag != nil {
			lag.record(time.Since(due))
		}
		fn(i)
		n++
	}
	return n
}

// waitFor polls cond until it holds or timeout passes.
func (w *worker) waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-t.C:
		case <-w.ctx.Done():
			return false
		}
	}
	return true
}

// reply builds a Reply from counts and histograms, with the error samples
// and the counters every command reports.
func (w *worker) reply(counts map[string]int64, hists map[string]*hist) Reply {
	r := Reply{Counts: counts, Hists: map[string][]byte{}}
	if r.Counts == nil {
		r.Counts = map[string]int64{}
	}
	w.smu.Lock()
	suspects := w.suspects
	w.suspects = nil
	w.smu.Unlock()
	var falseOffline, afterLoss int64
	for _, s := range suspects {
		if s.l.lost.Load() {
			afterLoss++
			continue
		}
		falseOffline++
		w.errs.add("%s saw %s offline while it was connected", s.watcher, s.target)
	}
	r.Counts["false_offline"] = falseOffline
	r.Counts["offline_after_lost_connection"] = afterLoss
	r.Counts["unexpected_disconnects"] = w.unexpected.Swap(0)
	r.Counts["denied"] = w.denied.Swap(0)
	r.Counts["server_errors"] = w.serverErrors.Swap(0)
	for name, h := range hists {
		enc, err := h.encode()
		if err != nil {
			r.Err = fmt.Sprintf("encode %s: %v", name, err)
			continue
		}
		r.Hists[name] = enc
		if h.negative > 0 {
			r.Counts[name+"_negative"] = h.negative
		}
	}
	r.Errors = w.errs.take()
	return r
}

// connect dials every connection, ConnectConcurrency at a time and at most
// ConnectRate per second, retrying a failed dial twice.
func (w *worker) connect() Reply {
	connectHist := newHist()
	var connected, failed, dialErrors atomic.Int64
	polled0 := w.polledConns.Load()
	sem := make(chan struct{}, w.setup.ConnectConcurrency)
	var wg sync.WaitGroup
	one := func(v *vconn) {
		defer func() { <-sem }()
		for attempt := range 3 {
			if attempt > 0 {
				select {
				case <-time.After(time.Duration(attempt) * 250 * time.Millisecond):
				case <-w.ctx.Done():
					return
				}
			}
			start := time.Now()
			c, err := w.dial(v)
			if err != nil {
				dialErrors.Add(1)
				w.errs.add("dial %s: %v", v.user, err)
				continue
			}
			connectHist.record(time.Since(start))
			w.attach(v, c)
			connected.Add(1)
			return
		}
		failed.Add(1)
	}
	rate := w.setup.ConnectRate
	if rate <= 0 {
		rate = 1e9
	}
	// Connections made early must heartbeat while the rest connect:
	// connecting can take longer than a TTL.
	w.startHeartbeats()
	start := time.Now()
	w.pace(rate, maxCommandTime, len(w.conns), nil, func(i int) {
		sem <- struct{}{}
		v := w.conns[i]
		wg.Go(func() { one(v) })
	})
	wg.Wait()
	elapsed := time.Since(start)
	return w.reply(map[string]int64{
		"conns":       int64(len(w.conns)),
		"connected":   connected.Load(),
		"failed":      failed.Load(),
		"dial_errors": dialErrors.Load(),
		"polled":      w.polledConns.Load() - polled0,
		"elapsed_ns":  int64(elapsed),
	}, map[string]*hist{"connect": connectHist})
}
