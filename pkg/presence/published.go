package presence

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Published is a writer's report of events it published (PublishedSubject):
// per user, the newest revision whose public event (Pub) and whose self
// events (Self) it published. The fanout, which publishes the events of
// revisions nobody published, reads these reports rather than every event.
type Published struct {
	Pub  map[string]uint64 `json:"pub,omitempty"`
	Self map[string]uint64 `json:"self,omitempty"`
}

// Len returns the number of entries of the report.
func (p *Published) Len() int { return len(p.Pub) + len(p.Self) }

// note records that an event of user at revision rev was published.
func (p *Published) note(user string, self bool, rev uint64) {
	m := &p.Pub
	if self {
		m = &p.Self
	}
	if *m == nil {
		*m = make(map[string]uint64)
	}
	if rev > (*m)[user] {
		(*m)[user] = rev
	}
}

const (
	// ReportEvery is how long a Publisher gathers the events it published
	// before it reports them: well within the fanout's delay (250ms by
	// default), and once per period at most, whatever the rate of
	// changes. A writer with nothing published sends nothing.
	ReportEvery = 50 * time.Millisecond
	// reportMost bounds the entries of one report message (about 30
	// bytes each): a longer report is sent in several.
	reportMost = 10_000
	// reportFlushTimeout bounds the wait for the server to confirm that it
	// has the events a report names.
	reportFlushTimeout = 5 * time.Second
)

// Publisher publishes the events of status writes on a NATS connection and
// reports what it published to the fanouts (PublishedSubject), at most
// once per ReportEvery. It is safe for concurrent use.
//
// A report names only events the server is known to have: before sending
// it, the Publisher waits for the server to answer a ping on the
// connection the events were published on, and if the connection was lost
// and made again since, it sends nothing, and the fanout publishes those
// events (again, perhaps: gateways drop what they have).
type Publisher struct {
	nc    *nats.Conn
	every time.Duration // ReportEvery, but in tests
	// local is the gateway whose self events deliver takes in process
	// (HandOver); empty for none. Both are set before the first Publish.
	local   string
	deliver func(*SelfEvent)

	mu sync.Mutex
	// pending is what was published since the last report; conn is the
	// connection's reconnect count from before its first event was published.
	pending Published
	conn    uint64
	// armed is set while a report is scheduled or being sent.
	armed  bool
	closed bool
}

// NewPublisher returns a Publisher that publishes on nc. The caller owns
// nc, and calls Close before it closes nc.
func NewPublisher(nc *nats.Conn) *Publisher { return &Publisher{nc: nc, every: ReportEvery} }

// HandOver has the Publisher hand the self events meant for gateway to
// deliver, on the goroutine that calls Publish, instead of publishing
// them, for the writes whose Publish says handOver. The gateway that
// writes a user's record most often holds all of the user's connections:
// its own self event need not go through NATS to come back to it. It must
// be called before the first Publish.
func (p *Publisher) HandOver(gateway string, deliver func(*SelfEvent)) {
	p.local, p.deliver = gateway, deliver
}

// Publish publishes the events a status write of userID calls for
// (Changes), and returns how many it published. A write that wrote
// nothing calls for none. Events are published on core NATS: a write whose
// events are lost (its writer died) is published by the fanout instead.
// With handOver, the self event for the gateway of HandOver is handed to
// its deliver function instead, and not counted: the caller says so only
// when every connection of that gateway the written record names will
// see what deliver delivers.
func (p *Publisher) Publish(userID string, w *Write, handOver bool) (int, error) {
	if !w.Written {
		return 0, nil
	}
	pub, self, gws := Changes(userID, &w.Prev, &w.Next, w.Rev)
	// Read before publishing: read after, it could count a reconnect that
	// completed meanwhile, and a report the new connection confirms would
	// name events lost with the old one.
	conn := p.nc.Stats().Reconnects
	n := 0
	var pubSent, selfSent bool
	err := func() error {
		if pub != nil {
			data, err := EncodeEvent(pub)
			if err != nil {
				return err
			}
			if err := p.nc.Publish(EventSubject(userID), data); err != nil {
				return err
			}
			n++
			pubSent = true
		}
		if self != nil {
			var data []byte
			for _, gw := range gws {
				if handOver && gw == p.local && p.deliver != nil {
					p.deliver(self)
					continue
				}
				if data == nil {
					var err error
					if data, err = EncodeSelfEvent(self); err != nil {
						return err
					}
				}
				if err := p.nc.Publish(SelfSubject(gw), data); err != nil {
					return err
				}
				n++
			}
			selfSent = true
		}
		return nil
	}()
	p.note(userID, w.Rev, pubSent, selfSent, conn)
	return n, err
}

// note adds what a write published (its public event, its self events)
// to the next report, and schedules it. conn is the connection's
// reconnect count from before they were published.
func (p *Publisher) note(user string, rev uint64, pub, self bool, conn uint64) {
	if !pub && !self {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if p.pending.Len() > 0 && conn != p.conn {
		// The connection was made again since those events were
		// published: they may not have reached the server.
		p.pending = Published{}
	}
	if p.pending.Len() == 0 {
		p.conn = conn
	}
	if pub {
		p.pending.note(user, false, rev)
	}
	if self {
		p.pending.note(user, true, rev)
	}
	if !p.armed {
		p.armed = true
		time.AfterFunc(p.every, p.report)
	}
}

// report sends what was noted, and schedules the next report if more was
// noted meanwhile.
func (p *Publisher) report() {
	p.send()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending.Len() == 0 || p.closed {
		p.armed = false
		return
	}
	time.AfterFunc(p.every, p.report)
}

// send sends the pending report, once the server has confirmed it has its
// events.
func (p *Publisher) send() {
	p.mu.Lock()
	rep, conn := p.pending, p.conn
	p.pending = Published{}
	p.mu.Unlock()
	if rep.Len() == 0 {
		return
	}
	// Not connected: the events wait in the client's buffer, or are lost;
	// either way the fanout publishes them, and no ping waits for NATS.
	if !p.nc.IsConnected() || p.nc.FlushTimeout(reportFlushTimeout) != nil || p.nc.Stats().Reconnects != conn {
		return
	}
	for _, part := range split(rep, reportMost) {
		data, err := json.Marshal(part)
		if err != nil {
			return
		}
		if p.nc.Publish(PublishedSubject, data) != nil {
			return
		}
	}
}

// split divides a report into reports of at most most entries each.
func split(rep Published, most int) []Published {
	if rep.Len() <= most {
		return []Published{rep}
	}
	var out []Published
	var cur Published
	add := func(self bool, m map[string]uint64) {
		for user, rev := range m {
			if cur.Len() == most {
				out = append(out, cur)
				cur = Published{}
			}
			cur.note(user, self, rev)
		}
	}
	add(false, rep.Pub)
	add(true, rep.Self)
	if cur.Len() > 0 {
		out = append(out, cur)
	}
	return out
}

// Close sends what was published and not yet reported, and reports
// nothing more.
func (p *Publisher) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.send()
}
