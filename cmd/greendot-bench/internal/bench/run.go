package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/greendot/greendot/internal/sleep"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system"
)

// Run runs cfg.Scenario cfg.Repeat times, each on a fresh system, and
// returns the report. It blocks until every process it started has ended.
// On an error it returns what was measured so far with it.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.run = "b"
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The work directory holds the greendot binary, when it is built, and
	// a directory per run with its processes' logs and NATS store. It is
	// kept when a run fails.
	work, err := os.MkdirTemp("", "greendot-bench-")
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			_ = os.RemoveAll(work)
		}
	}()
	if err := cfg.findGreendot(ctx, work); err != nil {
		return nil, err
	}
	start := time.Now()
	rep := &Report{Scenario: cfg.Scenario, Machine: readMachine(), Config: cfg}
	defer func() { rep.Elapsed = time.Since(start) }()
	for i := range cfg.Repeat {
		cfg.run = newRunID()
		cfg.Logger.Info("bench run", "run", i+1, "of", cfg.Repeat, "scenario", cfg.Scenario, "conns", cfg.Conns)
		dir := filepath.Join(work, fmt.Sprintf("run-%d", i+1))
		res, err := runOnce(ctx, &cfg, dir)
		if res != nil {
			rep.Runs = append(rep.Runs, *res)
			rep.summarize()
		}
		if err != nil {
			keep = true
			return rep, fmt.Errorf("run %d of %d: %w (logs in %s)", i+1, cfg.Repeat, err, dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			cfg.Logger.Warn("remove the run's directory", "dir", dir, "err", err)
		}
	}
	return rep, nil
}

// findGreendot checks the greendot binary the configuration names, or
// builds one into dir when it names none and the run starts gateways.
func (c *Config) findGreendot(ctx context.Context, dir string) error {
	if len(c.GatewayURLs) > 0 {
		return nil
	}
	if c.Greendot != "" {
		if _, err := os.Stat(c.Greendot); err != nil {
			return fmt.Errorf("%w: greendot binary: %v", ErrInvalidConfig, err)
		}
		return nil
	}
	c.Greendot = filepath.Join(dir, "greendot")
	c.Logger.Info("building greendot", "package", system.Greendot, "binary", c.Greendot)
	if err := system.Build(ctx, c.Greendot, system.Greendot); err != nil {
		if errors.Is(err, system.ErrNoModule) {
			return fmt.Errorf("%w: no greendot binary given (--greendot), and %v", ErrInvalidConfig, err)
		}
		return err
	}
	return nil
}

// newRunID returns a short random prefix for user ids: a letter, then
// five of a-z 0-9, then an underscore.
func newRunID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [6]byte
	_, _ = rand.Read(b[:])
	out := []byte{'b'}
	for _, x := range b[1:] {
		out = append(out, alphabet[int(x)%len(alphabet)])
	}
	return string(append(out, '_'))
}

// runner is one run in progress.
type runner struct {
	cfg     *Config
	log     *slog.Logger
	sys     *sut
	workers []*workerHandle
	l       Layout
	res     *RunResult
	errs    []string
}

// runOnce starts a system and the workers, their files in dir, connects,
// runs the scenario's phase, and stops everything.
func runOnce(ctx context.Context, cfg *Config, dir string) (res *RunResult, err error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: cfg.Logger, l: cfg.layout(),
		res: &RunResult{Started: time.Now(), LoadBefore: loadAverage()}}
	defer func() {
		r.res.LoadAfter = loadAverage()
		r.res.Seconds = time.Since(r.res.Started).Seconds()
		r.res.Errors = r.errs
	}()

	r.log.Info("starting the system", "gateways", cfg.Gateways, "nats", cmpOr(cfg.NATSURL, "embedded"))
	sys, err := startSystem(ctx, cfg, r.log, dir)
	if err != nil {
		return r.res, err
	}
	r.sys = sys
	defer sys.stop()
	baseline := r.sample(ctx)

	if r.l.Watchers > 0 {
		r.log.Info("writing the follow graph", "edges", 2*r.l.Watchers*r.l.Follows)
		if err := sys.writeGraph(ctx, r.l); err != nil {
			return r.res, err
		}
	}
	r.workers, err = startWorkers(ctx, cfg, dir)
	if err != nil {
		return r.res, err
	}
	defer stopWorkers(r.workers)
	urls := make([]string, len(sys.gateways))
	for i, g := range sys.gateways {
		urls[i] = g.ws
	}
	if _, err := r.call(ctx, time.Minute, func(k int) Command {
		return Command{Op: OpSetup, Setup: &Setup{
			Worker: k, Layout: r.l, URLs: urls,
			ConnectConcurrency: cfg.ConnectConcurrency,
			ConnectRate:        cfg.ConnectRate * float64(r.l.WorkerConns(k)) / float64(r.l.Total()),
			DialTimeout:        cfg.DialTimeout,
			Compression:        cfg.WSCompression,
		}}
	}); err != nil {
		return r.res, err
	}
	if err := r.connect(ctx); err != nil {
		return r.res, err
	}
	if r.l.Watchers > 0 {
		if err := r.subscribe(ctx); err != nil {
			return r.res, err
		}
	}
	switch cfg.Scenario {
	case ScenarioIdle:
		err = r.idle(ctx, baseline)
	case ScenarioPropagation:
		err = r.propagation(ctx)
	case ScenarioDeath:
		err = r.death(ctx)
	case ScenarioChurn:
		err = r.churn(ctx)
	case ScenarioStorm:
		err = r.storm(ctx)
	case ScenarioRoom:
		err = r.room(ctx)
	case ScenarioTyping:
		err = r.typing(ctx)
	case ScenarioHostile:
		err = r.hostile(ctx)
	}
	if err != nil {
		return r.res, err
	}
	// Disconnections from here on are the teardown's: the gateways go
	// first, so that the workers' ports are not left in TIME_WAIT.
	end, err := r.call(ctx, time.Minute, func(int) Command { return Command{Op: OpEnd} })
	if err != nil {
		return r.res, err
	}
	if cfg.Scenario == ScenarioIdle {
		r.add("unexpected disconnections", float64(sum(end, "unexpected_disconnects")), "count", "= 0")
	}
	sys.stop()
	stopWorkers(r.workers)
	r.workers = nil
	return r.res, nil
}

// call runs a command on every worker and keeps the error examples.
func (r *runner) call(ctx context.Context, timeout time.Duration, cmd func(k int) Command) ([]Reply, error) {
	replies, err := call(ctx, r.workers, timeout, cmd)
	for _, rep := range replies {
		for _, e := range rep.Errors {
			if len(r.errs) < 10 {
				r.errs = append(r.errs, fmt.Sprintf("worker %d: %s", rep.Worker, e))
			}
		}
	}
	return replies, err
}

// add appends a figure to the run's result.
func (r *runner) add(name string, value float64, unit, target string) {
	r.res.Figures = append(r.res.Figures, Figure{Name: name, Value: value, Unit: unit, Target: target})
}

// sum adds a count over replies.
func sum(replies []Reply, name string) int64 {
	var n int64
	for _, r := range replies {
		n += r.Counts[name]
	}
	return n
}

// maxCount returns the largest value of a count over replies.
func maxCount(replies []Reply, name string) int64 {
	var n int64
	for _, r := range replies {
		n = max(n, r.Counts[name])
	}
	return n
}

// mergeHist merges a histogram over replies.
func mergeHist(replies []Reply, name string) (*merged, error) {
	m := newMerged()
	for _, r := range replies {
		if enc, ok := r.Hists[name]; ok {
			if err := m.add(enc); err != nil {
				return nil, fmt.Errorf("%w: worker %d: %s: %v", ErrWorker, r.Worker, name, err)
			}
		}
	}
	return m, nil
}

// addLatency adds the p50, p99, p99.9 (when wanted) and max of a
// histogram, in milliseconds.
func (r *runner) addLatency(what string, h *merged, p999 bool, p99Target string) {
	r.add(what+" p50", h.ms(50), "ms", "")
	r.add(what+" p99", h.ms(99), "ms", p99Target)
	if p999 {
		r.add(what+" p99.9", h.ms(99.9), "ms", "")
	}
	r.add(what+" max", h.maxMS(), "ms", "")
}

// connect dials every connection.
func (r *runner) connect(ctx context.Context) error {
	r.log.Info("connecting", "conns", r.l.Total(), "workers", r.l.Workers, "sources", r.l.Sources)
	start := time.Now()
	replies, err := r.call(ctx, maxCommandTime, func(int) Command { return Command{Op: OpConnect} })
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	connected, failed := sum(replies, "connected"), sum(replies, "failed")
	h, err := mergeHist(replies, "connect")
	if err != nil {
		return err
	}
	r.add("connections", float64(connected), "count", fmt.Sprintf("= %d", r.l.Total()))
	r.add("connections failed", float64(failed), "count", "= 0")
	r.add("dial errors (retried)", float64(sum(replies, "dial_errors")), "count", "")
	r.add("connections read through epoll", float64(sum(replies, "polled")), "count", "")
	r.add("connections lost while connecting", float64(sum(replies, "unexpected_disconnects")), "count", "= 0")
	r.add("connect rate while connecting", float64(connected)/elapsed.Seconds(), "conn/s", "")
	r.add("connect time p50", h.ms(50), "ms", "")
	r.add("connect time p99", h.ms(99), "ms", "")
	r.log.Info("connected", "conns", connected, "failed", failed, "seconds", elapsed.Seconds())
	if connected == 0 {
		return fmt.Errorf("%w: no connection could be made: %s", ErrWorker, strings.Join(r.errs, "; "))
	}
	return nil
}

// subscribe makes every watcher subscribe.
func (r *runner) subscribe(ctx context.Context) error {
	r.log.Info("subscribing", "watchers", r.l.Watchers, "follows", r.l.Follows)
	replies, err := r.call(ctx, 10*time.Minute, func(int) Command {
		return Command{Op: OpSubscribe, Timeout: 5 * time.Minute}
	})
	if err != nil {
		return err
	}
	r.add("watchers subscribed", float64(sum(replies, "subscribed")), "count", fmt.Sprintf("= %d", r.l.Watchers))
	r.add("subscriptions denied", float64(sum(replies, "denied")), "count", "= 0")
	r.add("false offline (at subscribe)", float64(sum(replies, "false_offline")), "count", "= 0")
	return nil
}

// heartbeatInterval is the gateways' heartbeat interval, as configured.
func (r *runner) heartbeatInterval() time.Duration {
	if r.cfg.HeartbeatInterval > 0 {
		return r.cfg.HeartbeatInterval
	}
	return min(15*time.Second, r.connTTL()/2)
}

// connTTL is the gateways' connection TTL, as configured.
func (r *runner) connTTL() time.Duration {
	if r.cfg.ConnTTL > 0 {
		return r.cfg.ConnTTL.Round(time.Second)
	}
	return 30 * time.Second
}

// gatewaySample is one gateway's state at one moment.
type gatewaySample struct {
	ok   bool
	rss  int64
	heap int64
	cpu  time.Duration
	// writes counts the gateway's JetStream writes: connection keys,
	// status records and its lease.
	writes float64
	conns  float64
	// procs is its GOMAXPROCS.
	procs float64
}

// sample is the system's state at one moment.
type sample struct {
	at       time.Time
	gateways []gatewaySample
	// procs are the other processes: reaper, fanout, workers, and this
	// process (which holds the embedded NATS server).
	procs map[string]procSample
	// stored is the last sequence of each of greendot's streams (the
	// messages ever stored in it), by bucket; absent if unread.
	stored map[string]uint64
	// slab is the kernel's slab memory, bytes.
	slab int64
}

// writtenBuckets are the buckets whose writes a sample counts.
var writtenBuckets = []string{presence.LeasesBucket, presence.ConnsBucket, presence.StatusBucket}

// sample reads every gateway's RSS and CPU (from /proc when it is a child,
// else from its /metrics), its heap and KV writes (from /metrics), and the
// other processes' RSS and CPU.
func (r *runner) sample(ctx context.Context) sample {
	s := sample{at: time.Now(), gateways: make([]gatewaySample, len(r.sys.gateways)), procs: map[string]procSample{}, stored: map[string]uint64{}, slab: slabBytes()}
	for _, b := range writtenBuckets {
		st, err := r.sys.store.JetStream().Stream(ctx, presence.StreamName(b))
		if err != nil {
			r.log.Warn("read stream", "bucket", b, "err", err)
			continue
		}
		info, err := st.Info(ctx)
		if err != nil {
			r.log.Warn("read stream", "bucket", b, "err", err)
			continue
		}
		s.stored[b] = info.State.LastSeq
	}
	var wg sync.WaitGroup
	for i, g := range r.sys.gateways {
		wg.Go(func() {
			gs := &s.gateways[i]
			m, err := scrape(ctx, g.http)
			if err != nil {
				r.log.Warn("read gateway metrics", "gateway", i, "err", err)
				return
			}
			gs.ok = true
			gs.heap = int64(m["go_memstats_heap_inuse_bytes"])
			for k, v := range m {
				if strings.HasPrefix(k, "greendot_gateway_kv_writes_total{") {
					gs.writes += v
				}
			}
			gs.writes += m["greendot_gateway_lease_refreshes_total"]
			gs.conns = m["greendot_gateway_connections"]
			gs.procs = m["go_sched_gomaxprocs_threads"]
			gs.rss = int64(m["process_resident_memory_bytes"])
			gs.cpu = time.Duration(m["process_cpu_seconds_total"] * float64(time.Second))
			if g.proc != nil {
				if ps, err := readProc(g.proc.Pid()); err == nil {
					gs.rss, gs.cpu = ps.rss, ps.cpu
				}
			}
		})
	}
	wg.Wait()
	for _, c := range r.sys.others {
		if ps, err := readProc(c.Pid()); err == nil {
			s.procs[c.Name()] = ps
		}
	}
	var workers procSample
	for _, h := range r.workers {
		if pid := h.pid(); pid != 0 {
			if ps, err := readProc(pid); err == nil {
				workers.rss += ps.rss
				workers.cpu += ps.cpu
			}
		}
	}
	s.procs["workers"] = workers
	if ps, err := readProc(os.Getpid()); err == nil {
		s.procs["bench"] = ps
	}
	return s
}

// during runs run, which loads the system from from for d and may then
// wait for the load's last effects, and samples the system with sample at
// from and once d has passed: the window over which the load's CPU is
// reckoned. It returns both samples once run has returned.
func during(ctx context.Context, from time.Time, d time.Duration, sample func(context.Context) sample, run func() error) (a, b sample, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sampled := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		if sleep.For(sctx, time.Until(from)) != nil {
			return
		}
		a = sample(sctx)
		if sleep.For(sctx, time.Until(from.Add(d))) != nil {
			return
		}
		b, sampled = sample(sctx), true
	}()
	if err = run(); err != nil {
		cancel()
	}
	<-done
	if err == nil && !sampled {
		err = ctx.Err()
	}
	return a, b, err
}

// addCPU adds the CPU each kind of process used between two samples, in
// percent of one core, and, when the bench started the whole system with
// NATS in its own process and the workers apart, greendot's in all.
func (r *runner) addCPU(a, b sample, during string) {
	secs := b.at.Sub(a.at).Seconds()
	var gw time.Duration
	for i := range b.gateways {
		if a.gateways[i].ok && b.gateways[i].ok {
			gw += b.gateways[i].cpu - a.gateways[i].cpu
		}
	}
	all := gw
	r.add("gateways CPU "+during, 100*gw.Seconds()/secs, "% of a core", "")
	for _, name := range []string{"reaper", "fanout"} {
		if pa, ok := a.procs[name]; ok {
			used := b.procs[name].cpu - pa.cpu
			all += used
			r.add(name+" CPU "+during, 100*used.Seconds()/secs, "% of a core", "")
		}
	}
	nats := "bench process (orchestrator"
	if r.sys.embedded() {
		nats += " and embedded NATS"
	}
	if r.cfg.InProcessWorkers {
		nats += " and workers"
	}
	bench := b.procs["bench"].cpu - a.procs["bench"].cpu
	all += bench
	r.add(nats+") CPU "+during, 100*bench.Seconds()/secs, "% of a core", "")
	if !r.cfg.InProcessWorkers {
		r.add("bench workers CPU "+during, 100*(b.procs["workers"].cpu-a.procs["workers"].cpu).Seconds()/secs, "% of a core", "")
	}
	// With NATS elsewhere, or the workers in the bench process, the sum
	// would leave a part of greendot out or count the load's own.
	_, reaper := a.procs["reaper"]
	_, fanout := a.procs["fanout"]
	if r.sys.embedded() && !r.cfg.InProcessWorkers && reaper && fanout && len(r.cfg.GatewayURLs) == 0 {
		r.add("greendot's processes (gateways, reaper, fanout, bench process) CPU "+during, 100*all.Seconds()/secs, "% of a core", "")
	}
}

// idle holds the connections, waits a heartbeat interval so every
// connection has sent heartbeats, then measures over the window.
func (r *runner) idle(ctx context.Context, baseline sample) error {
	settle := r.heartbeatInterval() + 2*time.Second
	r.log.Info("holding", "settle", settle.String(), "window", r.cfg.Duration.String())
	if err := sleep.For(ctx, settle); err != nil {
		return err
	}
	a := r.sample(ctx)
	if err := sleep.For(ctx, r.cfg.Duration); err != nil {
		return err
	}
	b := r.sample(ctx)
	secs := b.at.Sub(a.at).Seconds()

	var conns float64
	var rssBase, rssAfter, heapBase, heapAfter int64
	var writes, procs float64
	for i := range b.gateways {
		g0, g1, g2 := baseline.gateways[i], a.gateways[i], b.gateways[i]
		if !g0.ok || !g2.ok {
			return fmt.Errorf("%w: gateway %d metrics could not be read", ErrSystem, i)
		}
		gf := GatewayFigure{
			Gateway: i, Conns: g2.conns,
			RSSBaseline: g0.rss, RSSAfter: g2.rss, HeapBaseline: g0.heap, HeapAfter: g2.heap,
		}
		if g1.ok {
			gf.CPUPercent = 100 * (g2.cpu - g1.cpu).Seconds() / secs
			gf.WritesPerSec = (g2.writes - g1.writes) / secs
			writes += gf.WritesPerSec
		}
		r.res.Gateways = append(r.res.Gateways, gf)
		conns += g2.conns
		rssBase += g0.rss
		rssAfter += g2.rss
		heapBase += g0.heap
		heapAfter += g2.heap
		procs = max(procs, g2.procs)
	}
	if conns == 0 {
		return fmt.Errorf("%w: the gateways hold no connections", ErrSystem)
	}
	const mib = 1 << 20
	r.add("connections held by the gateways", conns, "count", "")
	r.add("gateway RSS per connection", float64(rssAfter-rssBase)/conns, "bytes", "<= 1536")
	r.add("gateway heap in use per connection", float64(heapAfter-heapBase)/conns, "bytes", "")
	r.add("gateways RSS before connecting", float64(rssBase)/mib, "MiB", "")
	r.add("gateways RSS holding the connections", float64(rssAfter)/mib, "MiB", "")
	r.add("gateway GOMAXPROCS (the most of any)", procs, "threads", "")
	if w := b.procs["workers"]; w.rss > 0 && !r.cfg.InProcessWorkers {
		// Workers start after the baseline: this is their whole RSS.
		r.add("bench workers RSS per connection", float64(w.rss)/conns, "bytes", "")
	}
	if baseline.slab > 0 && b.slab > 0 {
		// Both ends of every connection are on this machine.
		r.add("kernel slab per connection (both ends)", float64(b.slab-baseline.slab)/conns, "bytes", "")
	}
	var gwCPU time.Duration
	for i := range b.gateways {
		gwCPU += b.gateways[i].cpu - a.gateways[i].cpu
	}
	r.add("gateway CPU per 10k connections", 100*gwCPU.Seconds()/secs/(conns/10000), "% of a core", "")
	r.add("gateways' JetStream writes while idle", writes, "writes/s", "")
	var stored float64
	for _, bk := range writtenBuckets {
		n0, ok0 := a.stored[bk]
		n1, ok1 := b.stored[bk]
		if !ok0 || !ok1 {
			continue
		}
		r.add(bk+" messages stored while idle", float64(n1-n0)/secs, "messages/s", "")
		stored += float64(n1 - n0)
	}
	r.add("JetStream messages stored while idle", stored/secs, "messages/s", "")
	r.addCPU(a, b, "while idle")
	return nil
}

// propagation runs the status changes and measures their latency.
func (r *runner) propagation(ctx context.Context) error {
	settle := 10*time.Second + r.cfg.BatchInterval
	r.log.Info("changing statuses", "rate", r.cfg.Rate, "duration", r.cfg.Duration.String())
	var replies []Reply
	a, b, err := during(ctx, time.Now(), r.cfg.Duration, r.sample, func() (err error) {
		replies, err = r.call(ctx, r.cfg.Duration+settle+time.Minute, func(k int) Command {
			lo, hi := r.l.TargetRange(k)
			return Command{Op: OpPropagate, Rate: r.cfg.Rate * float64(hi-lo) / float64(r.l.Targets),
				Duration: r.cfg.Duration, Timeout: settle}
		})
		return err
	})
	if err != nil {
		return err
	}
	lat, err := mergeHist(replies, "latency")
	if err != nil {
		return err
	}
	lag, err := mergeHist(replies, "send_lag")
	if err != nil {
		return err
	}
	sent := sum(replies, "sent")
	r.addLatency("set_status to presence_batch", lat, true, "<= 50")
	r.add("status changes sent", float64(sent), "count", "")
	r.add("status change rate", float64(sent)/r.cfg.Duration.Seconds(), "changes/s", fmt.Sprintf(">= %g", r.cfg.Rate))
	r.add("changes expected by watchers", float64(sum(replies, "expected")), "count", "")
	r.add("changes seen by watchers", float64(sum(replies, "delivered")), "count", "= expected")
	r.add("watcher views not converged after settling", float64(sum(replies, "mismatches")), "count", "= 0")
	r.add("changes whose send was not found", float64(sum(replies, "stale")), "count", "= 0")
	r.add("false offline", float64(sum(replies, "false_offline")), "count", "= 0")
	r.add("unexpected disconnections", float64(sum(replies, "unexpected_disconnects")), "count", "= 0")
	r.add("set_status send lag p99", lag.ms(99), "ms", "")
	if err := r.addSlow(replies, "set_status to presence_batch", "changes"); err != nil {
		return err
	}
	r.addCPU(a, b, "while changing")
	return nil
}

// death silences the targets and measures when watchers see them offline.
func (r *runner) death(ctx context.Context) error {
	ttl := r.connTTL()
	timeout := ttl + 30*time.Second
	r.log.Info("silencing targets", "targets", r.l.Targets, "ttl", ttl.String())
	replies, err := r.call(ctx, timeout+time.Minute, func(int) Command {
		return Command{Op: OpDeath, Timeout: timeout}
	})
	if err != nil {
		return err
	}
	h, err := mergeHist(replies, "offline_after_ttl")
	if err != nil {
		return err
	}
	r.add("connection TTL", ttl.Seconds(), "s", "")
	r.addLatency("offline seen after TTL", h, false, "<= 1000")
	r.add("targets silenced", float64(sum(replies, "silenced")), "count", fmt.Sprintf("= %d", r.l.Targets))
	r.add("offline sightings expected", float64(sum(replies, "expected")), "count", "")
	r.add("offline seen by watchers", float64(sum(replies, "seen")), "count", "= expected")
	r.add("false offline", float64(sum(replies, "false_offline")), "count", "= 0")
	r.add("unexpected disconnections", float64(sum(replies, "unexpected_disconnects")), "count", "= 0")
	return nil
}

// addSlow adds what the workers' speed probes saw of the machine while a
// phase was measured (worker.watchSpeed): how much of the time its
// processors ran at under half their usual speed, and the latencies of
// the deliveries no such span touched, as the figures of what (the
// latency's name) and of the things seen (changes, signals). Nothing,
// where no worker could probe.
func (r *runner) addSlow(replies []Reply, what, things string) error {
	probed := int64(0)
	var medians []int64 // one per worker that probed
	for _, rep := range replies {
		if n := rep.Counts["probed_ns"]; n > 0 {
			probed += n
			medians = append(medians, rep.Counts["probe_median_ns"])
		}
	}
	if len(medians) == 0 {
		return nil
	}
	slices.Sort(medians)
	steady, err := mergeHist(replies, "latency_clear")
	if err != nil {
		return err
	}
	r.add("machine ran slow (speed probe)", 100*float64(sum(replies, "slow_ns"))/float64(probed), "% of the time", "")
	r.add("machine's slow spans (speed probe)", float64(sum(replies, "slow_spans"))/float64(len(medians)), "count", "")
	// How long the probe's work usually took: runs on a slower machine,
	// or in a slower hour of the same one, take longer, and their CPU
	// figures are higher for the same work.
	r.add("speed probe median", float64(medians[len(medians)/2])/1000, "µs", "")
	r.add(things+" seen clear of slow spans", float64(steady.Count()), "count", "")
	r.add(things+" seen but not logged", float64(sum(replies, "deliveries_unlogged")), "count", "= 0")
	r.addLatency(what+" clear of slow spans", steady, true, "")
	return nil
}

// churn replaces connections at the configured rate.
func (r *runner) churn(ctx context.Context) error {
	grace := r.cfg.OfflineGrace
	if grace == 0 {
		grace = 3 * time.Second
	}
	settle := grace.Round(time.Second) + 5*time.Second
	churnable := r.l.Targets + r.l.Idle
	r.log.Info("churning", "rate", r.cfg.Rate, "duration", r.cfg.Duration.String())
	var replies []Reply
	a, b, err := during(ctx, time.Now(), r.cfg.Duration, r.sample, func() (err error) {
		replies, err = r.call(ctx, r.cfg.Duration+settle+2*time.Minute, func(k int) Command {
			tlo, thi := r.l.TargetRange(k)
			ilo, ihi := r.l.IdleRange(k)
			return Command{Op: OpChurn, Rate: r.cfg.Rate * float64(thi-tlo+ihi-ilo) / float64(churnable),
				Duration: r.cfg.Duration, Timeout: settle}
		})
		return err
	})
	if err != nil {
		return err
	}
	conn, err := mergeHist(replies, "connect")
	if err != nil {
		return err
	}
	lag, err := mergeHist(replies, "lag")
	if err != nil {
		return err
	}
	elapsed := time.Duration(maxCount(replies, "elapsed_ns")).Seconds()
	r.add("connects", float64(sum(replies, "connects")), "count", "")
	r.add("connects per second", float64(sum(replies, "connects"))/elapsed, "conn/s", fmt.Sprintf(">= %g", r.cfg.Rate))
	r.add("clean closes per second", float64(sum(replies, "closes"))/elapsed, "close/s", "")
	r.add("false offline", float64(sum(replies, "false_offline")), "count", "= 0")
	r.add("offline after a connection the gateway closed", float64(sum(replies, "offline_after_lost_connection")), "count", "")
	r.add("connect errors", float64(sum(replies, "connect_errors")), "count", "= 0")
	r.add("replacements skipped (generator behind)", float64(sum(replies, "skipped")), "count", "= 0")
	r.add("unexpected disconnections", float64(sum(replies, "unexpected_disconnects")), "count", "= 0")
	r.addLatency("connect (dial to hello)", conn, false, "")
	r.add("replacement start lag p99", lag.ms(99), "ms", "")
	r.addCPU(a, b, "while churning")
	return nil
}

// storm restarts gateways and measures how long their clients take to
// be connected again.
func (r *runner) storm(ctx context.Context) error {
	n := r.cfg.StormGateways
	if n == 0 {
		n = len(r.sys.gateways)
	}
	gws := make([]int, n)
	for i := range gws {
		gws[i] = i
	}
	timeout := r.cfg.Jitter + 4*time.Minute
	sig := syscall.SIGTERM
	if r.cfg.StormSignal == "kill" {
		sig = syscall.SIGKILL
	}
	if _, err := r.call(ctx, time.Minute, func(int) Command {
		return Command{Op: OpStorm, Gateways: gws, Jitter: r.cfg.Jitter, Timeout: timeout}
	}); err != nil {
		return err
	}
	r.log.Info("restarting gateways", "gateways", n, "signal", r.cfg.StormSignal)
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = r.sys.restartGateway(ctx, r.sys.gateways[i], sig) })
	}
	wg.Wait()
	restarted := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	replies, err := r.call(ctx, timeout+time.Minute, func(int) Command {
		return Command{Op: OpStormWait}
	})
	if err != nil {
		return err
	}
	h, err := mergeHist(replies, "reconnect")
	if err != nil {
		return err
	}
	expected, reconnected := sum(replies, "expected"), sum(replies, "reconnected")
	last := time.Unix(0, maxCount(replies, "last_hello_ns"))
	r.add("gateways restarted", float64(n), "count", "")
	r.add("clients to reconnect", float64(expected), "count", "")
	r.add("clients reconnected", float64(reconnected), "count", fmt.Sprintf("= %d", expected))
	r.add("restart time (signal to ready)", restarted.Seconds(), "s", "")
	if reconnected > 0 {
		r.add("time until all online again", last.Sub(t0).Seconds(), "s", "")
	}
	r.add("reconnect (closed to hello) p50", h.ms(50)/1000, "s", "")
	r.add("reconnect (closed to hello) p99", h.ms(99)/1000, "s", "")
	r.add("reconnect (closed to hello) max", h.maxMS()/1000, "s", "")
	r.add("dial attempts", float64(sum(replies, "attempts")), "count", "")
	r.add("clients never closed by the restart", float64(sum(replies, "never_closed")), "count", "= 0")
	r.add("offline seen by watchers during the storm", float64(sum(replies, "offline_seen")), "count", "")
	r.add("unexpected disconnections", float64(sum(replies, "unexpected_disconnects")), "count", "= 0")
	return nil
}
