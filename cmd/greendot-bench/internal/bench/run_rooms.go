package bench

import (
	"context"
	"fmt"
	"time"
)

// roomsJoin makes every member join its room (the churners first, so that
// every room_state lists them) and adds the figures of joining and of the
// gateways' memory per membership.
func (r *runner) roomsJoin(ctx context.Context, plan *RoomPlan) error {
	total := r.l.Total()
	members := plan.rooms(total) * plan.members(total)
	r.log.Info("joining rooms", "rooms", plan.rooms(total), "members", members)
	// Joining ends within a third of the run's time left, when the run
	// has a deadline: a member never shown its room full is then reported
	// as such, with the workers' errors, before the run runs out of time.
	timeout := 5 * time.Minute
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d)/3)
	}
	a := r.sample(ctx)
	var replies []Reply
	group := ""
	if plan.Churners > 0 {
		first, err := r.call(ctx, timeout+time.Minute, func(int) Command {
			return Command{Op: OpJoin, Room: plan, Group: GroupChurners, Timeout: timeout}
		})
		if err != nil {
			return err
		}
		replies, group = first, GroupRest
	}
	rest, err := r.call(ctx, timeout+time.Minute, func(int) Command {
		return Command{Op: OpJoin, Room: plan, Group: group, Timeout: timeout}
	})
	if err != nil {
		return err
	}
	replies = append(replies, rest...)
	b := r.sample(ctx)
	h, err := mergeHist(replies, "join")
	if err != nil {
		return err
	}
	r.add("rooms", float64(plan.rooms(total)), "count", "")
	r.add("members joined", float64(sum(replies, "joined")), "count", fmt.Sprintf("= %d", members))
	r.add("joins failed", float64(sum(replies, "failed")), "count", "= 0")
	r.addLatency("join to room_state while filling", h, false, "")
	r.add("room_state frames truncated while filling", float64(sum(replies, "truncated")), "count", "")
	r.add("members not shown their room full", float64(sum(rest, "not_full")), "count", "= 0")
	var heap, rss int64
	for i := range b.gateways {
		if !a.gateways[i].ok || !b.gateways[i].ok {
			return fmt.Errorf("%w: gateway %d metrics could not be read", ErrSystem, i)
		}
		heap += b.gateways[i].heap - a.gateways[i].heap
		rss += b.gateways[i].rss - a.gateways[i].rss
	}
	r.add("gateway heap in use per membership", float64(heap)/float64(members), "bytes", "")
	r.add("gateway RSS per membership", float64(rss)/float64(members), "bytes", "")
	return nil
}

// room fills one room with every connection, then has members leave and
// join it again at the configured rate.
func (r *runner) room(ctx context.Context) error {
	plan := r.cfg.roomPlan()
	if err := r.roomsJoin(ctx, &plan); err != nil {
		return err
	}
	const settle = 30 * time.Second
	plan.Start = time.Now().Add(time.Second).UnixNano()
	length := time.Duration(float64(2*(plan.Pairs+plan.Hold)) / plan.Rate * float64(time.Second))
	r.log.Info("leaving and joining", "rate", plan.Rate, "churners", plan.Churners, "duration", length.String())
	var replies []Reply
	a, b, err := during(ctx, time.Unix(0, plan.Start), length, r.sample, func() (err error) {
		replies, err = r.call(ctx, time.Second+length+settle+time.Minute, func(int) Command {
			return Command{Op: OpRoomChurn, Room: &plan, Timeout: settle}
		})
		return err
	})
	if err != nil {
		return err
	}
	diff, err := mergeHist(replies, "diff")
	if err != nil {
		return err
	}
	join, err := mergeHist(replies, "join")
	if err != nil {
		return err
	}
	lag, err := mergeHist(replies, "lag")
	if err != nil {
		return err
	}
	leaves, joins := sum(replies, "leaves"), sum(replies, "joins")
	seen := sum(replies, "leaves_seen") + sum(replies, "joins_seen")
	r.addLatency("leave or join to room_diff", diff, true, "")
	r.addLatency("join to room_state in the full room", join, false, "")
	r.add("leaves sent", float64(leaves), "count", "")
	r.add("joins sent", float64(joins), "count", "")
	// The first Hold slots' joins and the last Hold slots' leaves are
	// empty: the rate is over the slots between.
	busy := float64(2*plan.Pairs) / plan.Rate
	r.add("leaves and joins per second", float64(leaves+joins)/busy, "changes/s", fmt.Sprintf(">= %g", r.cfg.Rate))
	r.add("leaves seen in room_diff", float64(sum(replies, "leaves_seen")), "count", "")
	r.add("joins seen in room_diff", float64(sum(replies, "joins_seen")), "count", "")
	if leaves+joins > 0 {
		r.add("members shown each change", float64(seen)/float64(leaves+joins), "members", "")
	}
	r.add("room_diff entries not on the schedule", float64(sum(replies, "stale")), "count", "= 0")
	r.add("joins again failed", float64(sum(replies, "join_failed")), "count", "= 0")
	r.add("leaves not sent", float64(sum(replies, "skipped")), "count", "= 0")
	r.add("members not shown the room full after settling", float64(sum(replies, "not_full")), "count", "= 0")
	r.add("unexpected disconnections", float64(sum(replies, "unexpected_disconnects")), "count", "= 0")
	r.add("leave/join send lag p99", lag.ms(99), "ms", "")
	r.addCPU(a, b, "while leaving and joining")
	return nil
}

// typing fills rooms of RoomSize members, then has one member of each
// room send a typing signal every TypingInterval.
func (r *runner) typing(ctx context.Context) error {
	plan := r.cfg.roomPlan()
	if err := r.roomsJoin(ctx, &plan); err != nil {
		return err
	}
	const settle = 5 * time.Second
	rooms := plan.rooms(r.l.Total())
	plan.Start = time.Now().Add(time.Second).UnixNano()
	r.log.Info("typing", "rooms", rooms, "signals/s", plan.Rate, "duration", r.cfg.Duration.String())
	var replies []Reply
	a, b, err := during(ctx, time.Unix(0, plan.Start), r.cfg.Duration, r.sample, func() (err error) {
		replies, err = r.call(ctx, time.Second+r.cfg.Duration+settle+time.Minute, func(int) Command {
			return Command{Op: OpTyping, Room: &plan, Duration: r.cfg.Duration, Timeout: settle}
		})
		return err
	})
	if err != nil {
		return err
	}
	sig, err := mergeHist(replies, "signal")
	if err != nil {
		return err
	}
	lag, err := mergeHist(replies, "lag")
	if err != nil {
		return err
	}
	sent := sum(replies, "sent")
	r.addLatency("typing to room_signal", sig, true, "<= 50")
	r.add("typing signals sent", float64(sent), "count", "")
	r.add("typing signals per second", float64(sent)/r.cfg.Duration.Seconds(), "signals/s", fmt.Sprintf(">= %.0f", plan.Rate))
	r.add("signals expected by members", float64(sent*int64(plan.Size-1)), "count", "")
	r.add("signals seen by members", float64(sum(replies, "seen")), "count", "= expected")
	r.add("signals not understood", float64(sum(replies, "stale")), "count", "= 0")
	r.add("signals not sent", float64(sum(replies, "skipped")), "count", "= 0")
	r.add("unexpected disconnections", float64(sum(replies, "unexpected_disconnects")), "count", "= 0")
	r.add("typing send lag p99", lag.ms(99), "ms", "")
	if err := r.addSlow(replies, "typing to room_signal", "signals"); err != nil {
		return err
	}
	r.addCPU(a, b, "while typing")
	secs := b.at.Sub(a.at).Seconds()
	var gw time.Duration
	for i := range b.gateways {
		if a.gateways[i].ok && b.gateways[i].ok {
			gw += b.gateways[i].cpu - a.gateways[i].cpu
		}
	}
	per := float64(rooms) / 10000
	r.add("gateway CPU per 10k rooms while typing", 100*gw.Seconds()/secs/per, "% of a core", "")
	nats := (b.procs["bench"].cpu - a.procs["bench"].cpu).Seconds()
	if r.sys.embedded() && !r.cfg.InProcessWorkers {
		r.add("gateways and NATS CPU per 10k rooms while typing", 100*(gw.Seconds()+nats)/secs/per, "% of a core", "")
	}
	return nil
}
