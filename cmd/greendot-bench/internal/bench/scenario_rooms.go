package bench

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
)

// The groups of members OpJoin can be limited to.
const (
	GroupChurners = "churners"
	GroupRest     = "rest"
)

// RoomPlan places the members of a rooms scenario and schedules what they
// do. Every worker gets the same plan, so that one shown a change can tell
// from the member's user id when that change was due. Every connection of
// the layout (all idle ones: a rooms scenario has no targets or watchers)
// is a member, by its number.
//
// The schedule is a sequence of slots, slot i due at Start + i/Rate.
//
// In one room (Size zero), the Churners members whose user ids sort first
// (those a truncated room_state lists) leave and join again: slot 2q has
// churner q mod Churners leave, slot 2q+1 has churner (q-Hold) mod
// Churners join again, for q below Pairs. A churner is out of the room for
// Hold pairs of slots and in it for Churners-Hold.
//
// In rooms of Size members, slot j has a typing signal sent in room
// j mod rooms by its member (j / rooms) mod Size.
type RoomPlan struct {
	// Prefix starts every room id: the rooms are Prefix0, Prefix1, ...
	Prefix string `json:"prefix"`
	// Size is the members of each room; zero puts every connection in
	// one room. Connections beyond the last full room join none.
	Size int `json:"size,omitempty"`
	// Churners, Pairs and Hold shape the leaves and joins of one room.
	Churners int `json:"churners,omitempty"`
	Pairs    int `json:"pairs,omitempty"`
	Hold     int `json:"hold,omitempty"`
	// Start is when slot 0 is due (unix ns); Rate is slots per second.
	Start int64   `json:"start,omitempty"`
	Rate  float64 `json:"rate,omitempty"`
}

// rooms returns the number of rooms of total connections.
func (p *RoomPlan) rooms(total int) int {
	if p.Size == 0 {
		return 1
	}
	return total / p.Size
}

// members returns how many members each room has.
func (p *RoomPlan) members(total int) int {
	if p.Size == 0 {
		return total
	}
	return p.Size
}

// roomOf returns the room connection n joins, or "".
func (p *RoomPlan) roomOf(n, total int) string {
	r := 0
	if p.Size > 0 {
		r = n / p.Size
	}
	if r >= p.rooms(total) {
		return ""
	}
	return p.Prefix + strconv.Itoa(r)
}

// due returns when slot i is due, unix ns.
func (p *RoomPlan) due(i int) int64 {
	return p.Start + int64(float64(i)*float64(time.Second)/p.Rate)
}

// slotAt returns the last slot due at or before now, or -1.
func (p *RoomPlan) slotAt(now int64) int {
	if now < p.Start {
		return -1
	}
	i := int(float64(now-p.Start) * p.Rate / float64(time.Second))
	for i > 0 && p.due(i) > now {
		i--
	}
	for p.due(i+1) <= now {
		i++
	}
	return i
}

// lastChange returns when the newest leave (or join) of churner c due at
// or before now was due: false when none was.
func (p *RoomPlan) lastChange(c int, leave bool, now int64) (int64, bool) {
	s := p.slotAt(now)
	if s < 0 || p.Churners == 0 {
		return 0, false
	}
	// Pair q's leave is churner q mod Churners, its join churner
	// (q-Hold) mod Churners: find the newest q of c.
	q := s / 2
	if !leave && s%2 == 0 {
		q-- // slot 2q's pair has not had its join yet
	}
	off := c
	if !leave {
		off = c + p.Hold
	}
	q -= ((q-off)%p.Churners + p.Churners) % p.Churners
	// After the last pair of its kind, the newest is a round earlier.
	limit := p.Pairs
	if !leave {
		limit += p.Hold
	}
	if q >= limit {
		q -= ((q-limit)/p.Churners + 1) * p.Churners
	}
	switch {
	case q < 0, !leave && q < p.Hold:
		return 0, false
	case leave:
		return p.due(2 * q), true
	}
	return p.due(2*q + 1), true
}

// churners returns the connection numbers of the members that leave and
// join, in order: the plan's Churners user ids of the layout that sort
// first.
func churners(l Layout, k int) []int {
	if k == 0 {
		return nil
	}
	ids := make([]string, l.Idle)
	for n := range ids {
		ids[n] = l.User(RoleIdle, n)
	}
	slices.Sort(ids)
	out := make([]int, 0, k)
	for _, id := range ids[:min(k, len(ids))] {
		_, n, _ := l.ParseUser(id)
		out = append(out, n)
	}
	return out
}

// roomsState is a worker's part of a rooms scenario.
type roomsState struct {
	mu   sync.Mutex
	plan RoomPlan
	// churners are the churners' connection numbers; churnerOf maps a
	// connection number to its churner number, or -1.
	churners  []int
	churnerOf map[int]int
}

// setRooms takes the plan of a rooms scenario and places the members.
func (w *worker) setRooms(p RoomPlan) error {
	if w.l.Targets > 0 || w.l.Watchers > 0 {
		return fmt.Errorf("%w: a rooms scenario has no targets or watchers", ErrInvalidConfig)
	}
	if p.Prefix == "" || p.Size < 0 || p.Churners < 0 || p.Pairs < 0 || p.Hold < 0 || p.Rate < 0 ||
		p.Churners > 0 && p.Hold >= p.Churners {
		return fmt.Errorf("%w: room plan %+v", ErrInvalidConfig, p)
	}
	total := w.l.Total()
	w.rooms.mu.Lock()
	defer w.rooms.mu.Unlock()
	if w.rooms.plan.Prefix != p.Prefix || w.rooms.plan.Churners != p.Churners {
		w.rooms.churners = churners(w.l, p.Churners)
		w.rooms.churnerOf = make(map[int]int, len(w.rooms.churners))
		for c, n := range w.rooms.churners {
			w.rooms.churnerOf[n] = c
		}
		for _, v := range w.conns {
			v.room = p.roomOf(v.n, total)
			if v.room != "" && v.roomAns == nil {
				v.roomAns = make(chan subAnswer, 4)
			}
		}
	}
	w.rooms.plan = p
	return nil
}

// plan returns the plan in force.
func (w *worker) plan() (RoomPlan, map[int]int) {
	w.rooms.mu.Lock()
	defer w.rooms.mu.Unlock()
	return w.rooms.plan, w.rooms.churnerOf
}

// local returns this worker's member with connection number n, or nil.
func (w *worker) local(n int) *vconn {
	lo, hi := w.l.IdleRange(w.setup.Worker)
	if n < lo || n >= hi {
		return nil
	}
	return w.conns[n-lo]
}

// answerJoin hands a join's answer to the goroutine waiting for it.
func (w *worker) answerJoin(v *vconn, id, err string) {
	if v.roomAns == nil || id == "" || id[0] != 'j' {
		return
	}
	select {
	case v.roomAns <- subAnswer{id: id, err: err}:
	default:
	}
}

// roomFrame takes a room frame a member was sent.
func (w *worker) roomFrame(v *vconn, m *protocol.ServerMessage, now int64) {
	switch m.Type {
	case protocol.TypeRoomState:
		v.shownCnt.Store(int32(m.Count))
		if m.Truncated {
			w.truncated.Add(1)
		}
		w.answerJoin(v, m.ID, "")
	case protocol.TypeRoomDenied:
		w.denied.Add(1)
		w.errs.add("room_denied %s: %s", m.Room, m.Reason)
		w.answerJoin(v, m.ID, "room_denied: "+m.Reason)
	case protocol.TypeRoomDiff:
		v.shownCnt.Store(int32(m.Count))
		if w.phase.Load() != phaseRoomChurn {
			return
		}
		plan, churnerOf := w.plan()
		see := func(list []protocol.RoomMember, leave bool, seen *atomic.Int64) {
			for _, e := range list {
				r, n, ok := w.l.ParseUser(e.UserID)
				c, churner := churnerOf[n]
				if !ok || r != RoleIdle || !churner {
					w.stale.Add(1)
					continue
				}
				due, ok := plan.lastChange(c, leave, now)
				if !ok {
					w.stale.Add(1)
					continue
				}
				seen.Add(1)
				if h := w.latency.Load(); h != nil {
					h.record(time.Duration(now - due))
				}
			}
		}
		see(m.Leaves, true, &w.leavesSeen)
		see(m.Joins, false, &w.joinsSeen)
	case protocol.TypeRoomSignal:
		if w.phase.Load() != phaseTyping {
			return
		}
		for _, s := range m.Signals {
			var d struct {
				T int64 `json:"t"`
			}
			if s.Signal != protocol.SignalTyping || json.Unmarshal(s.Data, &d) != nil || d.T == 0 {
				w.stale.Add(1)
				continue
			}
			w.signalsSeen.Add(1)
			w.seenAt(d.T, now)
		}
	}
}

// joinOne sends v's join and waits for its room_state until deadline. It
// returns how long the answer took.
func (w *worker) joinOne(v *vconn, deadline time.Time) (time.Duration, error) {
	id := "j" + strconv.Itoa(int(v.joinSeq.Add(1)))
	meta := json.RawMessage(`{"name":"` + v.user + `"}`)
	start := time.Now()
	ok, err := w.send(v, func(c *client.Conn) error {
		return c.Send(protocol.ClientMessage{Type: protocol.TypeJoin, ID: id, Room: v.room, Meta: meta})
	})
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 0, fmt.Errorf("not connected")
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case a := <-v.roomAns:
			if a.id != id {
				continue // an answer to an earlier join
			}
			if a.err != "" {
				return 0, fmt.Errorf("refused: %s", a.err)
			}
			return time.Since(start), nil
		case <-timer.C:
			return 0, fmt.Errorf("no room_state within the timeout")
		case <-w.ctx.Done():
			return 0, w.ctx.Err()
		}
	}
}

// notFull counts this worker's members in a room whose newest frame of it
// does not show it full.
func (w *worker) notFull() int64 {
	plan, _ := w.plan()
	want := int32(plan.members(w.l.Total()))
	var n int64
	for _, v := range w.conns {
		if v.room != "" && v.shownCnt.Load() != want {
			n++
		}
	}
	return n
}

// join makes the worker's members of group join their rooms,
// ConnectConcurrency at a time, then waits until timeout for every member
// to be shown its room full (when group is not GroupChurners).
func (w *worker) join(group string, timeout time.Duration) Reply {
	deadline := time.Now().Add(timeout)
	_, churnerOf := w.plan()
	h := newHist()
	var joined, failed atomic.Int64
	sem := make(chan struct{}, w.setup.ConnectConcurrency)
	var wg sync.WaitGroup
	for _, v := range w.conns {
		_, churner := churnerOf[v.n]
		if v.room == "" || group == GroupChurners && !churner || group == GroupRest && churner {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			d, err := w.joinOne(v, deadline)
			if err != nil {
				failed.Add(1)
				w.errs.add("join of %s: %v", v.user, err)
				return
			}
			h.record(d)
			joined.Add(1)
		})
	}
	wg.Wait()
	if group != GroupChurners {
		w.waitFor(time.Until(deadline), func() bool { return w.notFull() == 0 })
	}
	return w.reply(map[string]int64{
		"joined":    joined.Load(),
		"failed":    failed.Load(),
		"truncated": w.truncated.Swap(0),
		"not_full":  w.notFull(),
	}, map[string]*hist{"join": h})
}

// roomChurn runs the plan's leaves and joins of this worker's churners,
// measuring each join's answer, while the readers measure when each
// member is shown each change; then waits up to settle for every member
// to be shown the room full again.
func (w *worker) roomChurn(settle time.Duration) Reply {
	plan, _ := w.plan()
	w.rooms.mu.Lock()
	order := w.rooms.churners
	w.rooms.mu.Unlock()
	if plan.Churners == 0 || plan.Rate <= 0 || len(order) < plan.Churners {
		return Reply{Err: "room_churn needs churners and a rate"}
	}
	lat, lag, rejoin := newHist(), newHist(), newHist()
	w.leavesSeen.Store(0)
	w.joinsSeen.Store(0)
	defer w.measure(phaseRoomChurn, lat)()
	var leaves, joins, failed, skipped atomic.Int64
	var wg sync.WaitGroup
	slots := 2 * (plan.Pairs + plan.Hold)
	w.paceFrom(time.Unix(0, plan.Start), plan.Rate, maxCommandTime, slots, lag, func(i int) {
		q, leave := i/2, i%2 == 0
		c := q % plan.Churners
		if !leave {
			c = ((q-plan.Hold)%plan.Churners + plan.Churners) % plan.Churners
		}
		if leave && q >= plan.Pairs || !leave && q < plan.Hold {
			return
		}
		v := w.local(order[c])
		if v == nil {
			return
		}
		if leave {
			ok, err := w.send(v, func(c *client.Conn) error {
				return c.Send(protocol.ClientMessage{Type: protocol.TypeLeave, Room: v.room})
			})
			switch {
			case err != nil:
				w.errs.add("leave of %s: %v", v.user, err)
				skipped.Add(1)
			case !ok:
				skipped.Add(1)
			default:
				leaves.Add(1)
			}
			return
		}
		joins.Add(1)
		// The join waits for its answer in its own goroutine; it is
		// answered long before the churner's next leave.
		wg.Go(func() {
			d, err := w.joinOne(v, time.Now().Add(settle))
			if err != nil {
				failed.Add(1)
				w.errs.add("join again of %s: %v", v.user, err)
				return
			}
			rejoin.record(d)
		})
	})
	wg.Wait()
	full := w.waitFor(settle, func() bool { return w.notFull() == 0 })
	if !full {
		w.errs.add("members were not all shown the room full after %v", settle)
	}
	return w.reply(map[string]int64{
		"leaves":      leaves.Load(),
		"joins":       joins.Load(),
		"join_failed": failed.Load(),
		"skipped":     skipped.Load(),
		"leaves_seen": w.leavesSeen.Swap(0),
		"joins_seen":  w.joinsSeen.Swap(0),
		"stale":       w.stale.Swap(0),
		"truncated":   w.truncated.Swap(0),
		"not_full":    w.notFull(),
	}, map[string]*hist{"diff": lat, "join": rejoin, "lag": lag})
}

// typing sends this worker's typing signals of the plan's schedule for d,
// each carrying its send time, while the readers measure when each member
// is shown each one; then waits settle for the last ones.
func (w *worker) typing(d, settle time.Duration) Reply {
	plan, _ := w.plan()
	total := w.l.Total()
	rooms := plan.rooms(total)
	if plan.Size < 2 || rooms == 0 || plan.Rate <= 0 {
		return Reply{Err: "typing needs rooms of at least 2 members and a rate"}
	}
	lat, lag := newHist(), newHist()
	w.signalsSeen.Store(0)
	defer w.measure(phaseTyping, lat)()
	speed := w.watchSpeed()
	var sent, skipped int64
	w.paceFrom(time.Unix(0, plan.Start), plan.Rate, d, -1, lag, func(j int) {
		v := w.local(j%rooms*plan.Size + j/rooms%plan.Size)
		if v == nil {
			return
		}
		ok, err := w.send(v, func(c *client.Conn) error {
			data := strconv.AppendInt([]byte(`{"t":`), time.Now().UnixNano(), 10)
			return c.Send(protocol.ClientMessage{Type: protocol.TypeSignal, Room: v.room,
				Signal: protocol.SignalTyping, Data: append(data, '}')})
		})
		switch {
		case err != nil:
			w.errs.add("typing of %s: %v", v.user, err)
			skipped++
		case !ok:
			skipped++
		default:
			sent++
		}
	})
	// Signals are not stored: nothing tells when the last one has been
	// delivered everywhere but time.
	w.waitFor(settle, func() bool { return false })
	counts, hists := map[string]int64{}, map[string]*hist{"signal": lat, "lag": lag}
	speed(counts, hists) // before the signals are counted: none logged goes uncounted
	counts["sent"], counts["skipped"] = sent, skipped
	counts["seen"], counts["stale"] = w.signalsSeen.Swap(0), w.stale.Swap(0)
	return w.reply(counts, hists)
}
