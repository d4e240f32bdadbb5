package bench

import (
	"context"
	"fmt"
	"time"
)

// hostile has the targets change status at the configured rate, watched
// by their watchers (the bystanders), through a baseline phase and then
// one phase per attack on the first gateway, each Duration long, and
// measures the bystanders' latency and losses and the gateways' CPU in
// each.
func (r *runner) hostile(ctx context.Context) error {
	settle := 10*time.Second + r.cfg.BatchInterval
	addr := r.sys.gateways[0].addr
	for p, name := range hostilePhases() {
		r.log.Info("hostile phase", "phase", name, "window", r.cfg.Duration.String())
		actx, cancel := context.WithTimeout(ctx, r.cfg.Duration)
		tallied := make(chan *attackTally, 1)
		if p > 0 {
			att := attacks[p-1]
			go func() { tallied <- runAttack(actx, p, att, addr) }()
		} else {
			tallied <- nil
		}
		var replies []Reply
		a, b, err := during(ctx, time.Now(), r.cfg.Duration, r.sample, func() (err error) {
			replies, err = r.call(ctx, r.cfg.Duration+settle+time.Minute, func(k int) Command {
				lo, hi := r.l.TargetRange(k)
				return Command{Op: OpPropagate, Rate: r.cfg.Rate * float64(hi-lo) / float64(r.l.Targets),
					Duration: r.cfg.Duration, Timeout: settle}
			})
			return err
		})
		cancel()
		tally := <-tallied
		if err != nil {
			return err
		}
		if err := r.addPhase(name, replies, tally, a, b); err != nil {
			return err
		}
	}
	return nil
}

// addPhase adds one hostile phase's figures, each named after it.
func (r *runner) addPhase(phase string, replies []Reply, t *attackTally, a, b sample) error {
	lat, err := mergeHist(replies, "latency")
	if err != nil {
		return err
	}
	name := func(s string) string { return phase + ": " + s }
	expected, delivered := sum(replies, "expected"), sum(replies, "delivered")
	r.add(name("bystander p50"), lat.ms(50), "ms", "")
	r.add(name("bystander p99"), lat.ms(99), "ms", "")
	r.add(name("bystander max"), lat.maxMS(), "ms", "")
	r.add(name("changes expected by bystanders"), float64(expected), "count", "")
	r.add(name("changes seen by bystanders"), float64(delivered), "count", "= expected")
	r.add(name("changes missed"), float64(max(0, expected-delivered)), "count", "= 0")
	r.add(name("bystander views not converged after settling"), float64(sum(replies, "mismatches")), "count", "= 0")
	r.add(name("bystander disconnections"), float64(sum(replies, "unexpected_disconnects")), "count", "= 0")
	if t != nil {
		r.add(name("attack frames, requests or bytes written"), float64(t.sent.Load()), "count", "")
		r.add(name("attack connections"), float64(t.dials.Load()), "count", "")
		r.add(name("attack connections the gateway closed"), float64(t.closed.Load()), "count", "")
		r.add(name("attack dials failed"), float64(t.dialErr.Load()), "count", "")
		t.mu.Lock()
		if t.dialEx != "" && len(r.errs) < 10 {
			r.errs = append(r.errs, phase+": a dial failed: "+t.dialEx)
		}
		t.mu.Unlock()
		for _, ans := range t.answerList() {
			t.mu.Lock()
			n := t.answers[ans]
			t.mu.Unlock()
			r.add(name(answerName(ans)), float64(n), "count", "")
		}
	}
	secs := b.at.Sub(a.at).Seconds()
	var gw time.Duration
	for i := range b.gateways {
		if a.gateways[i].ok && b.gateways[i].ok {
			gw += b.gateways[i].cpu - a.gateways[i].cpu
		}
	}
	r.add(name("gateway CPU"), 100*gw.Seconds()/secs, "% of a core", "")
	// The bench process holds the embedded NATS server, the attackers
	// and (in tests) the workers: its CPU is the load's as much as
	// greendot's.
	bench := b.procs["bench"].cpu - a.procs["bench"].cpu
	r.add(name("bench process (NATS and attackers) CPU"), 100*bench.Seconds()/secs, "% of a core", "")
	if len(replies) > 0 && expected == 0 {
		return fmt.Errorf("%w: phase %s: no change was expected by any bystander", ErrWorker, phase)
	}
	return nil
}
