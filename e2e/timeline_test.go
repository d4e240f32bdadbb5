package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/presence"
)

// The truth about one connection, from the test's own log.

// droppedLocked reports whether the gateway ended c before the protocol
// lets it: while the test still sent heartbeats, or a silent connection
// before the TTL after its last frame. The test then fails (checkConn
// says why), and the rest of the analysis takes the connection as ended
// when the gateway ended it, so that it reports nothing that follows from
// that alone. The caller holds c.mu.
func (s *stress) droppedLocked(c *conn) bool {
	if c.serverEnd.IsZero() {
		return false
	}
	return c.kind != endSilent || c.serverEnd.Before(c.lastSend.Add(s.ttl))
}

// protectedUntil is when c's user may be shown offline at the earliest, as
// far as c is concerned: a silent connection is live until the TTL after
// its last frame; a closed one lives out the offline grace (its key is
// written with the grace as TTL only after the close).
func (s *stress) protectedUntil(c *conn) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case s.droppedLocked(c):
		return c.serverEnd
	case c.kind == endNone:
		return farFuture
	case c.kind == endSilent:
		return c.lastSend.Add(s.ttl)
	default:
		return c.endAt.Add(s.grace)
	}
}

// occupiedUntil is when c stopped being live: its close, or the TTL after
// its last frame.
func (s *stress) occupiedUntil(c *conn) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case s.droppedLocked(c):
		return c.serverEnd
	case c.kind == endNone:
		return farFuture
	case c.kind == endSilent:
		return c.lastSend.Add(s.ttl)
	default:
		return c.endAt
	}
}

// offlineDeadline is when c must be out of its user's record, and watchers
// must have been told if it was the last: offlineSlack after protectedUntil,
// or after the reaper came back if none ran meanwhile.
func (s *stress) offlineDeadline(c *conn) time.Time {
	dl := s.protectedUntil(c).Add(offlineSlack)
	endAt := s.occupiedUntil(c)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.outages {
		if o.from.Before(dl) && o.end().After(endAt) {
			dl = later(dl, o.end().Add(offlineSlack))
		}
	}
	return dl
}

// component is a maximal run of overlapping connection spans.
type component struct {
	span
	conns []*conn
}

// union merges spans (one per connection, in any order) into components.
func union(spans []span, conns []*conn) []component {
	idx := make([]int, len(spans))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return spans[idx[a]].from.Before(spans[idx[b]].from) })
	var out []component
	for _, i := range idx {
		sp := spans[i]
		if !sp.from.Before(sp.to) {
			continue
		}
		if n := len(out); n > 0 && !sp.from.After(out[n-1].to) {
			out[n-1].to = later(out[n-1].to, sp.to)
			out[n-1].conns = append(out[n-1].conns, conns[i])
			continue
		}
		out = append(out, component{span: sp, conns: []*conn{conns[i]}})
	}
	return out
}

// subtract removes holes from spans.
func subtract(spans []component, holes []span) []component {
	for _, h := range holes {
		var next []component
		for _, sp := range spans {
			if !h.from.Before(sp.to) || !sp.from.Before(h.to) {
				next = append(next, sp)
				continue
			}
			if sp.from.Before(h.from) {
				next = append(next, component{span{sp.from, h.from}, sp.conns})
			}
			if h.to.Before(sp.to) {
				next = append(next, component{span{h.to, sp.to}, sp.conns})
			}
		}
		spans = next
	}
	return spans
}

// mustShowConnected returns when watchers must not show u offline: while a
// connection is live or protected, from propagation after the first one
// started (a stale offline may still be on its way before that), except
// while u chose invisible (until propagation after choosing again).
func (s *stress) mustShowConnected(u *user) []component {
	spans := make([]span, len(u.conns))
	for i, c := range u.conns {
		spans[i] = span{c.helloAt, s.protectedUntil(c)}
	}
	var out []component
	for _, comp := range union(spans, u.conns) {
		comp.from = comp.from.Add(propagation)
		if comp.from.Before(comp.to) {
			out = append(out, comp)
		}
	}
	holes := make([]span, len(u.invisible))
	for i, w := range u.invisible {
		holes[i] = span{w.from, w.end().Add(propagation)}
		if w.to.IsZero() {
			holes[i].to = farFuture
		}
	}
	return subtract(out, holes)
}

// gap is a time when u had no connection, and when watchers must show u
// offline from.
type gap struct {
	span
	due   time.Time
	ended []*conn // the connections that ended before it
	// removable is when the last of them could leave the record.
	removable time.Time
}

// mustShowOffline returns u's gaps: from the start, or the end of a run of
// connections, to the next dial (or the end of the test).
func (s *stress) mustShowOffline(u *user) []gap {
	spans := make([]span, len(u.conns))
	for i, c := range u.conns {
		spans[i] = span{c.dialAt, s.occupiedUntil(c)}
	}
	comps := union(spans, u.conns)
	var out []gap
	from := s.watching
	for i := 0; i <= len(comps); i++ {
		to := s.ended
		if i < len(comps) {
			to = comps[i].from
		}
		g := gap{span: span{from, to}, due: from}
		for _, c := range u.conns {
			if !s.occupiedUntil(c).After(from) {
				g.ended = append(g.ended, c)
				g.due = later(g.due, s.offlineDeadline(c))
				g.removable = later(g.removable, s.protectedUntil(c))
			}
		}
		if from.Before(to) {
			out = append(out, g)
		}
		if i < len(comps) {
			from = comps[i].to
		}
	}
	return out
}

// statusAt returns what a view showed at t ("" before it knew anything).
func statusAt(v []seen, t time.Time) presence.Status {
	i := sort.Search(len(v), func(i int) bool { return v[i].at.After(t) })
	if i == 0 {
		return ""
	}
	return v[i-1].status
}

// firstWhere returns the first moment in [from, to) at which v shows a
// status for which bad is true.
func firstWhere(v []seen, from, to time.Time, bad func(presence.Status) bool) (time.Time, presence.Status, bool) {
	if st := statusAt(v, from); bad(st) {
		return from, st, true
	}
	for _, x := range v {
		if x.at.After(from) && x.at.Before(to) && bad(x.status) {
			return x.at, x.status, true
		}
	}
	return time.Time{}, "", false
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func isOffline(st presence.Status) bool    { return st == presence.Offline }
func isNotOffline(st presence.Status) bool { return st != presence.Offline }

// stats are figures of one run, for the log.
type stats struct {
	connectedChecks, offlineChecks int
	// onlineLag is how long watchers took to show a user who connected
	// while shown offline, from the hello.
	onlineLag []time.Duration
	// offlineLag is how long after the grace or TTL ended watchers showed
	// a user offline, when a reaper ran all along.
	offlineLag []time.Duration
}

// analyse checks every watcher's view of every user against the truth,
// and fails the test with a timeline of each user involved.
func (s *stress) analyse() {
	s.t.Helper()
	var st stats
	var bad []string
	for _, u := range s.users {
		for _, p := range u.problems {
			bad = append(bad, fmt.Sprintf("%s: %s", u.id, p))
		}
		for _, c := range u.conns {
			bad = append(bad, s.checkConn(c)...)
		}
		connected := s.mustShowConnected(u)
		offline := s.mustShowOffline(u)
		for _, w := range s.watchers {
			v := w.view(u.id)
			heard := w.end() // what a watcher was told after its socket ended is not known
			for _, m := range connected {
				if !m.from.Before(heard) {
					continue
				}
				st.connectedChecks++
				if at, _, found := firstWhere(v, m.from, earlier(m.to, heard), isOffline); found {
					bad = append(bad, fmt.Sprintf("%s: FALSE OFFLINE: watcher %s shows offline at %s, while connection %s was live (must show connected from %s to %s)",
						u.id, w.id, s.since(at), s.connNames(m.conns), s.since(m.from), s.since(m.to)))
				}
			}
			for _, g := range offline {
				if !g.due.Before(earlier(g.to, heard)) {
					continue // a new connection came first, or the watcher was gone
				}
				st.offlineChecks++
				if at, shown, found := firstWhere(v, g.due, earlier(g.to, heard), isNotOffline); found {
					bad = append(bad, fmt.Sprintf("%s: STUCK ONLINE: watcher %s shows %s at %s, but the last connection (%s) ended by %s, so offline was due by %s",
						u.id, w.id, shown, s.since(at), s.connNames(g.ended), s.since(g.from), s.since(g.due)))
					continue
				}
				if len(g.ended) > 0 && g.due.Equal(g.removable.Add(offlineSlack)) {
					// When did the final run of offline start?
					i := sort.Search(len(v), func(i int) bool { return v[i].at.After(g.due) })
					for i > 0 && v[i-1].status == presence.Offline && v[i-1].at.After(g.from) {
						i--
					}
					if i < len(v) && v[i].status == presence.Offline && v[i].at.After(g.from) && !v[i].at.After(g.due) {
						st.offlineLag = append(st.offlineLag, v[i].at.Sub(g.removable))
					}
				}
			}
			for _, comp := range union(spansOf(u.conns, func(c *conn) span { return span{c.helloAt, s.protectedUntil(c)} }), u.conns) {
				if statusAt(v, comp.from) != presence.Offline || u.invisibleDuring(comp.span) {
					continue
				}
				if at, _, found := firstWhere(v, comp.from, comp.to, isNotOffline); found {
					st.onlineLag = append(st.onlineLag, at.Sub(comp.from))
				}
			}
		}
	}
	s.stats = st
	if len(bad) > 0 {
		for _, b := range bad {
			s.t.Error(b)
		}
		s.printTimelines(bad)
	}
}

// checkConn checks how one connection ended.
func (s *stress) checkConn(c *conn) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var bad []string
	for _, f := range c.frames {
		bad = append(bad, fmt.Sprintf("%s: #%d got an unexpected frame: %s", c.u.id, c.n, f))
	}
	switch c.kind {
	case endNone:
		if c.serverEnd.IsZero() {
			bad = append(bad, fmt.Sprintf("%s: #%d was never ended by the test", c.u.id, c.n))
		} else {
			bad = append(bad, fmt.Sprintf("%s: #%d: the gateway ended a live connection at %s (last frame sent at %s): %v",
				c.u.id, c.n, s.since(c.serverEnd), s.since(c.lastSend), c.serverErr))
		}
	case endSilent:
		due := c.lastSend.Add(s.ttl)
		switch {
		case c.serverEnd.IsZero():
			bad = append(bad, fmt.Sprintf("%s: #%d went silent at %s and the gateway never ended it", c.u.id, c.n, s.since(c.endAt)))
		case c.serverEnd.Before(due):
			bad = append(bad, fmt.Sprintf("%s: #%d: the gateway ended it at %s, before the TTL after its last frame (%s)", c.u.id, c.n, s.since(c.serverEnd), s.since(due)))
		case c.serverEnd.After(due.Add(offlineSlack)):
			bad = append(bad, fmt.Sprintf("%s: #%d: the gateway ended it at %s, more than %v after the TTL ran out (%s)", c.u.id, c.n, s.since(c.serverEnd), offlineSlack, s.since(due)))
		}
	default:
		if !c.serverEnd.IsZero() {
			bad = append(bad, fmt.Sprintf("%s: #%d: the gateway ended a live connection at %s (last frame sent at %s): %v",
				c.u.id, c.n, s.since(c.serverEnd), s.since(c.lastSend), c.serverErr))
		}
	}
	return bad
}

func spansOf(conns []*conn, f func(*conn) span) []span {
	out := make([]span, len(conns))
	for i, c := range conns {
		out[i] = f(c)
	}
	return out
}

// invisibleDuring reports whether u chose invisible at any time in sp (or
// shortly before it, as far as watchers can tell).
func (u *user) invisibleDuring(sp span) bool {
	for _, w := range u.invisible {
		if w.from.Before(sp.to) && sp.from.Before(w.end().Add(propagation)) {
			return true
		}
	}
	return false
}

func (s *stress) connNames(conns []*conn) string {
	names := make([]string, len(conns))
	for i, c := range conns {
		names[i] = fmt.Sprintf("#%d", c.n)
	}
	return strings.Join(names, ", ")
}

// view returns a copy of what the watcher was told of a user.
func (w *watcher) view(userID string) []seen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.views[userID])
}

// printTimelines logs the timeline of each user named at the start of a
// line ("u07: ..."), at most five of them.
func (s *stress) printTimelines(lines []string) {
	var ids []string
	for _, l := range lines {
		id, _, _ := strings.Cut(l, ":")
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) > 5 {
		s.t.Logf("%d users involved; timelines of the first 5", len(ids))
		ids = ids[:5]
	}
	for _, id := range ids {
		for _, u := range s.users {
			if u.id == id {
				s.t.Log(s.timeline(u))
			}
		}
	}
}

// timeline renders everything known about a user in time order: the
// test's actions, the gateway's ends of sockets, reaper outages, what each
// watcher was told, and the user's last status record revisions.
func (s *stress) timeline(u *user) string {
	var notes []note
	notes = append(notes, u.notes...)
	s.mu.Lock()
	notes = append(notes, s.notes...)
	s.mu.Unlock()
	for _, c := range u.conns {
		c.mu.Lock()
		if !c.serverEnd.IsZero() {
			notes = append(notes, note{c.serverEnd, fmt.Sprintf("#%d ended by the gateway: %v", c.n, c.serverErr)})
		}
		kind := c.kind
		c.mu.Unlock()
		if kind != endNone {
			notes = append(notes,
				note{s.protectedUntil(c), fmt.Sprintf("#%d may leave the record from here", c.n)},
				note{s.offlineDeadline(c), fmt.Sprintf("#%d must be gone from the record by here", c.n)})
		}
	}
	for _, w := range s.watchers {
		for _, x := range w.view(u.id) {
			notes = append(notes, note{x.at, fmt.Sprintf("    watcher %s (gateway %d) is told %s", w.id, w.gw, x.status)})
		}
	}
	sort.SliceStable(notes, func(i, j int) bool { return notes[i].at.Before(notes[j].at) })

	var b strings.Builder
	fmt.Fprintf(&b, "timeline of %s (seconds since the watchers started; churn started at %s):\n", u.id, s.since(s.churnAt))
	for _, c := range u.conns {
		fmt.Fprintf(&b, "  connection #%d: conn_id %s on gateway %d (%s)\n", c.n, c.id, c.gw, s.gws[c.gw].ID())
	}
	for _, n := range notes {
		if n.at.Before(farFuture) {
			fmt.Fprintf(&b, "  %9s  %s\n", s.since(n.at), n.what)
		}
	}
	b.WriteString(s.history(u.id))
	return b.String()
}

// history renders the newest revisions of a user's status record.
func (s *stress) history(userID string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := s.sys.Store.JetStream().KeyValue(ctx, presence.StatusBucket)
	if err != nil {
		return fmt.Sprintf("  (status history: %v)\n", err)
	}
	entries, err := kv.History(ctx, presence.StatusKey(userID))
	if err != nil {
		return fmt.Sprintf("  (status history: %v)\n", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  newest revisions of %s/%s:\n", presence.StatusBucket, userID)
	for _, e := range entries {
		if e.Operation() != jetstream.KeyValuePut {
			fmt.Fprintf(&b, "    rev %d %s\n", e.Revision(), e.Operation())
			continue
		}
		var rec presence.Record
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			fmt.Fprintf(&b, "    rev %d: %v\n", e.Revision(), err)
			continue
		}
		var conns []string
		for id, c := range rec.Conns {
			flags := ""
			if c.Closing {
				flags += " closing"
			}
			if c.Idle {
				flags += " idle"
			}
			conns = append(conns, fmt.Sprintf("%s(rev %d%s)", id, c.Rev, flags))
		}
		slices.Sort(conns)
		fmt.Fprintf(&b, "    rev %d at %s: chosen %q status %s public %s devices %d conns %v\n",
			e.Revision(), s.since(time.UnixMilli(rec.Updated)), rec.Chosen, rec.Status, rec.Public, rec.Devices, conns)
	}
	return b.String()
}

// summary logs what the run did and how fast the system answered.
func (s *stress) summary(took time.Duration) {
	counts := make(map[string]int)
	conns := 0
	for _, u := range s.users {
		for k, n := range u.counts {
			counts[k] += n
		}
		conns += len(u.conns)
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	s.t.Logf("%d users, %d watchers, %d gateways, %d connections; actions: %s",
		len(s.users), len(s.watchers), len(s.gws), conns, strings.Join(parts, " "))
	s.t.Logf("checked %d connected intervals and %d offline intervals across all watchers", s.stats.connectedChecks, s.stats.offlineChecks)
	var upgrade []time.Duration
	for _, u := range s.users {
		for _, c := range u.conns {
			upgrade = append(upgrade, c.helloAt.Sub(c.dialAt))
		}
	}
	s.t.Logf("dial to hello: %s", percentiles(upgrade))
	s.t.Logf("hello to watchers told online: %s", percentiles(s.stats.onlineLag))
	s.t.Logf("grace or TTL over to watchers told offline (a reaper running): %s", percentiles(s.stats.offlineLag))
	s.t.Logf("wall time %v", took.Round(time.Millisecond))
}

func percentiles(d []time.Duration) string {
	if len(d) == 0 {
		return "no samples"
	}
	slices.Sort(d)
	p := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))].Round(time.Millisecond) }
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", len(d), p(0.5), p(0.99), d[len(d)-1].Round(time.Millisecond))
}
