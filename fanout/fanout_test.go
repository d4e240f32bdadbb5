package fanout_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/tcpproxy"
	"github.com/greendot/greendot/pkg/presence"
)

// bench is an embedded NATS server, a store that plays the gateways' part,
// and subscriptions that see what fanouts publish.
type bench struct {
	t      *testing.T
	srv    *server.Server
	nc     *nats.Conn
	store  *presence.Store
	events *nats.Subscription // every public event
}

func newBench(t *testing.T, srv *server.Server, opts ...nats.Option) *bench {
	t.Helper()
	if srv == nil {
		srv = natstest.RunServer(t)
	}
	nc := natstest.Connect(t, srv, opts...)
	store, err := presence.Open(context.Background(), nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{t: t, srv: srv, nc: nc, store: store}
	b.events = b.subscribe(presence.EventWildcard)
	return b
}

func (b *bench) subscribe(subject string) *nats.Subscription {
	b.t.Helper()
	sub, err := b.nc.SubscribeSync(subject)
	if err != nil {
		b.t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		b.t.Fatal(err)
	}
	return sub
}

// startFanout runs a fanout on its own connection until the returned
// function (or the end of the test) stops it.
func (b *bench) startFanout(cfg fanout.Config, opts ...nats.Option) (stop func()) {
	b.t.Helper()
	_, stop = b.runFanout(cfg, opts...)
	return stop
}

// runFanout is startFanout, and returns the fanout too.
func (b *bench) runFanout(cfg fanout.Config, opts ...nats.Option) (f *fanout.Service, stop func()) {
	b.t.Helper()
	f, err := fanout.New(natstest.Connect(b.t, b.srv, opts...), cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					b.t.Errorf("fanout: %v", err)
				}
			case <-time.After(30 * time.Second):
				b.t.Errorf("fanout did not stop within 30s")
			}
		})
	}
	b.t.Cleanup(stop)
	natstest.CheckFor(b.t, 10*time.Second, 10*time.Millisecond, func() error { return f.Ready(ctx) })
	return f, stop
}

// update changes a user's record as a gateway would, and returns the
// record and its revision.
func (b *bench) update(user string, mutate func(*presence.Record)) (presence.Record, uint64) {
	b.t.Helper()
	rec, rev, written, err := b.store.UpdateStatus(context.Background(), user, func(r *presence.Record) error {
		mutate(r)
		return nil
	})
	if err != nil || !written {
		b.t.Fatalf("update %s: written %v, %v", user, written, err)
	}
	return rec, rev
}

// barrier writes a change of a user nobody else uses and returns once its
// event was published: every revision written before it has been handled
// by then (one fanout handles revisions in order).
func (b *bench) barrier() {
	b.t.Helper()
	n := time.Now().UnixNano()
	_, rev := b.update("barrier", func(r *presence.Record) {
		if len(r.Conns) == 0 {
			r.SetConn(fmt.Sprint(n), presence.ConnInfo{Gateway: "gw-barrier"})
		} else {
			r.Conns = nil
		}
	})
	if ev := b.nextEvent(); ev.UserID != "barrier" || ev.Rev != rev {
		b.t.Fatalf("unexpected event before the barrier: %+v", ev)
	}
}

func (b *bench) nextEvent() presence.Event {
	b.t.Helper()
	return next[presence.Event](b.t, b.events)
}

func next[T any](t *testing.T, sub *nats.Subscription) T {
	t.Helper()
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("%s: %v", sub.Subject, err)
	}
	var v T
	if err := json.Unmarshal(m.Data, &v); err != nil {
		t.Fatalf("%s: %s: %v", sub.Subject, m.Data, err)
	}
	return v
}

// none checks that nothing more arrived on sub.
func none(t *testing.T, sub *nats.Subscription) {
	t.Helper()
	if n, _, err := sub.Pending(); err != nil || n != 0 {
		m, _ := sub.NextMsg(0)
		t.Errorf("%s: %d more messages (%v), the first: %s", sub.Subject, n, err, m.Data)
	}
}

func TestEvents(t *testing.T) {
	b := newBench(t, nil)
	b.startFanout(fanout.Config{})
	gw1 := b.subscribe(presence.SelfSubject("gw1"))
	gw2 := b.subscribe(presence.SelfSubject("gw2"))

	// Online: one public event with the record's revision, and the
	// user's own state to the gateway holding the connection.
	rec, rev := b.update("alice", func(r *presence.Record) { r.SetConn("a1", presence.ConnInfo{Gateway: "gw1"}) })
	ev := b.nextEvent()
	if ev != (presence.Event{UserID: "alice", Status: presence.Online, LastSeen: rec.LastSeen, Rev: rev, At: rec.Updated}) {
		t.Errorf("event = %+v, want online at rev %d", ev, rev)
	}
	if self := next[presence.SelfEvent](t, gw1); self != (presence.SelfEvent{UserID: "alice", Status: presence.Online, Devices: 1, Rev: rev}) {
		t.Errorf("self = %+v", self)
	}

	// A second device on another gateway: nobody else can see it, so no
	// public event; both gateways learn the device count.
	_, rev = b.update("alice", func(r *presence.Record) { r.SetConn("a2", presence.ConnInfo{Gateway: "gw2"}) })
	for _, sub := range []*nats.Subscription{gw1, gw2} {
		if self := next[presence.SelfEvent](t, sub); self.Devices != 2 || self.Rev != rev || self.Status != presence.Online {
			t.Errorf("%s: self = %+v, want online with 2 devices at %d", sub.Subject, self, rev)
		}
	}
	b.barrier()

	// Busy: a public event.
	_, rev = b.update("alice", func(r *presence.Record) { r.Chosen = presence.Busy })
	if ev := b.nextEvent(); ev.Status != presence.Busy || ev.Rev != rev {
		t.Errorf("event = %+v, want busy at %d", ev, rev)
	}
	for _, sub := range []*nats.Subscription{gw1, gw2} {
		if self := next[presence.SelfEvent](t, sub); self.Status != presence.Busy || self.Rev != rev {
			t.Errorf("%s: self = %+v, want busy at %d", sub.Subject, self, rev)
		}
	}

	// Invisible looks offline to others; the user's own devices see the
	// truth.
	_, rev = b.update("alice", func(r *presence.Record) { r.Chosen = presence.Invisible })
	if ev := b.nextEvent(); ev.Status != presence.Offline || ev.Rev != rev {
		t.Errorf("event = %+v, want offline at %d", ev, rev)
	}
	for _, sub := range []*nats.Subscription{gw1, gw2} {
		if self := next[presence.SelfEvent](t, sub); self.Status != presence.Invisible || self.Rev != rev {
			t.Errorf("%s: self = %+v, want invisible at %d", sub.Subject, self, rev)
		}
	}

	// An invisible user's devices going idle or closing changes nothing
	// others see.
	b.update("alice", func(r *presence.Record) {
		for id, c := range r.Conns {
			c.Idle = true
			r.Conns[id] = c
		}
	})
	_, rev = b.update("alice", func(r *presence.Record) {
		c := r.Conns["a2"]
		c.Closing = true
		r.Conns["a2"] = c
	})
	b.barrier()
	// The closing connection's gateway is no longer told.
	if self := next[presence.SelfEvent](t, gw1); self.Devices != 1 || self.Rev != rev {
		t.Errorf("self = %+v, want 1 device at %d", self, rev)
	}
	b.barrier()
	none(t, gw2)

	// Visible again, then every connection gone: offline, with last_seen.
	b.update("alice", func(r *presence.Record) { r.Chosen = presence.Online })
	if ev := b.nextEvent(); ev.Status != presence.Away {
		t.Errorf("event = %+v, want away (every connection idle)", ev)
	}
	rec, rev = b.update("alice", func(r *presence.Record) { r.Conns = nil })
	if ev := b.nextEvent(); ev.Status != presence.Offline || ev.Rev != rev || ev.LastSeen != rec.LastSeen || ev.LastSeen == 0 {
		t.Errorf("event = %+v, want offline at %d with last_seen %d", ev, rev, rec.LastSeen)
	}

	// An operator deletes the record: offline, at the marker's revision.
	b.update("bob", func(r *presence.Record) { r.SetConn("b1", presence.ConnInfo{Gateway: "gw1"}) })
	if ev := b.nextEvent(); ev.UserID != "bob" || ev.Status != presence.Online {
		t.Errorf("event = %+v, want bob online", ev)
	}
	if err := b.store.DeleteStatus(context.Background(), "bob"); err != nil {
		t.Fatal(err)
	}
	_, markerRev, _ := b.store.Status(context.Background(), "bob")
	if ev := b.nextEvent(); ev.UserID != "bob" || ev.Status != presence.Offline || ev.Rev != markerRev {
		t.Errorf("event = %+v, want bob offline at the marker's %d", ev, markerRev)
	}
	// Versions start over in a record made again; its first change is
	// published.
	b.update("bob", func(r *presence.Record) { r.SetConn("b2", presence.ConnInfo{Gateway: "gw1"}) })
	if ev := b.nextEvent(); ev.UserID != "bob" || ev.Status != presence.Online {
		t.Errorf("event = %+v, want bob online again", ev)
	}

	// Keys that are not user ids, and values that are not records, are
	// skipped without stopping the fanout.
	kv, err := b.store.JetStream().KeyValue(context.Background(), presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), "carol", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), "dave.x", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	b.barrier()
}

// TestRestartPublishesTheTruth: a fanout that starts over (its memory of
// what it published is gone) publishes what the newest revisions say, and
// never an older revision again, nor a revision that left the public view
// as it was.
func TestRestartPublishesTheTruth(t *testing.T) {
	b := newBench(t, nil)
	stop := b.startFanout(fanout.Config{})
	b.update("erin", func(r *presence.Record) { r.SetConn("e1", presence.ConnInfo{Gateway: "gw1"}) })
	b.update("erin", func(r *presence.Record) { r.Chosen = presence.Busy })
	b.nextEvent()
	b.nextEvent()
	stop()

	// Written while no fanout runs: a device change only, then a change
	// others see.
	b.update("erin", func(r *presence.Record) { r.SetConn("e2", presence.ConnInfo{Gateway: "gw1"}) })
	_, rev := b.update("erin", func(r *presence.Record) { r.Chosen = presence.Away })
	b.startFanout(fanout.Config{})
	ev := b.nextEvent()
	if ev.UserID != "erin" || ev.Status != presence.Away || ev.Rev != rev {
		t.Errorf("after a restart: %+v, want erin away at %d", ev, rev)
	}
	b.barrier()
}

// TestRedelivery: revisions whose acknowledgement never reaches the server
// are delivered again and again. A revision delivered again after a newer
// one was published must not be published again: its event would say what
// is no longer true (gateways drop it by revision, but every gateway
// watching the user receives it, and the fanout's memory would go back).
func TestRedelivery(t *testing.T) {
	srv := natstest.RunServerWithOptions(t, &server.Options{
		Users: []*server.User{
			{Username: "operator", Password: "pw"},
			{Username: "fanout", Password: "pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.ACK.>"}},
			}},
		},
	})
	b := newBench(t, srv, nats.UserInfo("operator", "pw"))
	b.startFanout(fanout.Config{AckWait: 100 * time.Millisecond, Delay: 10 * time.Millisecond},
		nats.UserInfo("fanout", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))

	_, rev1 := b.update("frank", func(r *presence.Record) { r.SetConn("f1", presence.ConnInfo{Gateway: "gw1"}) })
	if ev := b.nextEvent(); ev.Rev != rev1 || ev.Status != presence.Online {
		t.Fatalf("event = %+v, want online at %d", ev, rev1)
	}
	_, rev2 := b.update("frank", func(r *presence.Record) { r.Chosen = presence.Busy })
	newest := rev1
	deadline := time.Now().Add(time.Second) // ten redeliveries of each
	for time.Now().Before(deadline) {
		m, err := b.events.NextMsg(time.Until(deadline))
		if err != nil {
			break // nothing more within the window
		}
		var ev presence.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Rev <= newest {
			t.Fatalf("revision %d (%s) published again after %d was", ev.Rev, ev.Status, newest)
		}
		newest = ev.Rev
	}
	if newest != rev2 {
		t.Errorf("newest event at %d, want %d", newest, rev2)
	}
}

// TestWritersPublishFirst: a writer publishes its revision's events right
// after its write and reports them, and the fanout, which reads the
// report, publishes nothing more; when a writer dies between its write and
// its publish, or publishes without reporting (an earlier version), the
// fanout publishes them, once its Delay has passed.
func TestWritersPublishFirst(t *testing.T) {
	b := newBench(t, nil)
	const delay = 500 * time.Millisecond
	b.startFanout(fanout.Config{Delay: delay})
	ctx := context.Background()
	selfs := b.subscribe(presence.SelfWildcard)
	reports := b.subscribe(presence.PublishedSubject)
	pub := presence.NewPublisher(b.nc)
	t.Cleanup(pub.Close)

	// A writer that publishes: one event of each, its own, and a report.
	w, err := b.store.WriteStatus(ctx, "gina", &presence.Cached{}, func(r *presence.Record) error {
		r.SetConn("g1", presence.ConnInfo{Gateway: "gw1", Lease: "E"})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := pub.Publish("gina", &w, false); err != nil || n != 2 {
		t.Fatalf("published %d events, %v; want 2", n, err)
	}
	if ev := b.nextEvent(); ev.UserID != "gina" || ev.Rev != w.Rev {
		t.Fatalf("event = %+v, want gina's at %d", ev, w.Rev)
	}
	next[presence.SelfEvent](t, selfs)
	if rep := next[presence.Published](t, reports); rep.Pub["gina"] != w.Rev || rep.Self["gina"] != w.Rev || rep.Len() != 2 {
		t.Fatalf("report = %+v, want gina's events at %d", rep, w.Rev)
	}

	// A writer that dies before it publishes: the fanout publishes, after
	// its delay.
	_, rev := b.update("hank", func(r *presence.Record) { r.SetConn("h1", presence.ConnInfo{Gateway: "gw1", Lease: "E"}) })
	written := time.Now()
	if ev := b.nextEvent(); ev.UserID != "hank" || ev.Rev != rev {
		t.Fatalf("event = %+v, want hank's at %d", ev, rev)
	}
	if took := time.Since(written); took < delay/2 {
		t.Errorf("the fanout published %v after the write, before its %v delay", took, delay)
	}
	if ev := next[presence.SelfEvent](t, selfs); ev.UserID != "hank" {
		t.Errorf("self event = %+v, want hank's", ev)
	}
	// By now gina's revision was handled too: nothing more of hers.
	none(t, b.events)
	none(t, selfs)

	// A writer that publishes the events but reports nothing: the fanout
	// cannot know, and publishes them again, which watchers drop.
	rec, rev := b.update("ivy", func(r *presence.Record) { r.SetConn("i1", presence.ConnInfo{Gateway: "gw1", Lease: "E"}) })
	ev, self, gws := presence.Changes("ivy", &presence.Record{}, &rec, rev)
	for subject, v := range map[string]any{presence.EventSubject("ivy"): ev, presence.SelfSubject(gws[0]): self} {
		data, _ := json.Marshal(v)
		if err := b.nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if ev := b.nextEvent(); ev.UserID != "ivy" || ev.Rev != rev {
			t.Fatalf("event = %+v, want ivy's at %d, twice", ev, rev)
		}
		if ev := next[presence.SelfEvent](t, selfs); ev.UserID != "ivy" || ev.Rev != rev {
			t.Fatalf("self event = %+v, want ivy's at %d, twice", ev, rev)
		}
	}
	none(t, b.events)
	none(t, selfs)
}

// TestPublishRetried: when the fanout cannot publish a revision's events
// (its connection is down and buffers nothing), it publishes them once it
// can. A revision handed back for redelivery would come back to the same
// fanout as one it had handled already, and be acknowledged unpublished.
func TestPublishRetried(t *testing.T) {
	dir := t.TempDir()
	srv := natstest.RunServerWithOptions(t, &server.Options{StoreDir: dir})
	port := srv.Addr().(*net.TCPAddr).Port
	b := newBench(t, srv)
	f, _ := b.runFanout(fanout.Config{Delay: time.Second, AckWait: 2 * time.Second},
		nats.ReconnectBufSize(-1), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))

	// Written without a writer's events: the fanout's to publish, once
	// its Delay has passed, by when the server is down.
	_, rev := b.update("yara", func(r *presence.Record) { r.SetConn("y1", presence.ConnInfo{Gateway: "gw1"}) })
	natstest.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if v, _ := metricstest.Value(f.Registry(), "greendot_fanout_revisions_total"); v == 0 {
			return errors.New("the fanout has not received the revision yet")
		}
		return nil
	})
	srv.Shutdown()
	srv.WaitForShutdown()
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if v, _ := metricstest.Value(f.Registry(), "greendot_fanout_revisions_failed_total"); v == 0 {
			return errors.New("the fanout has not failed to publish yet")
		}
		return nil
	})
	natstest.RunServerWithOptions(t, &server.Options{StoreDir: dir, Port: port})

	if ev := b.nextEvent(); ev.UserID != "yara" || ev.Rev != rev || ev.Status != presence.Online {
		t.Fatalf("event = %+v, want yara online at %d", ev, rev)
	}
	// And the revision was acknowledged once its events were out.
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		info, err := b.fanoutConsumer()
		if err != nil {
			return err
		}
		if info.NumAckPending != 0 || info.NumPending != 0 {
			return fmt.Errorf("%d revisions unacknowledged, %d not delivered", info.NumAckPending, info.NumPending)
		}
		return nil
	})
}

// TestEventsLostInFlightPublishedAgain: the fanout publishes a dead
// writer's revision and acknowledges it, and its connection dies with both
// in flight: the server never had them, and delivers the revision again.
// The fanout must publish its events again, whether it handled a newer
// revision of the user meanwhile or not: acknowledging the redelivery as
// handled already, or as older than a revision handled since, would leave
// the user's watchers with what they saw before it until the user changes
// again.
func TestEventsLostInFlightPublishedAgain(t *testing.T) {
	srv := natstest.RunServer(t)
	b := newBench(t, srv)
	gw2 := b.subscribe(presence.SelfSubject("gw2"))
	px := startLossyProxy(t, srv.Addr().String())
	// AckWait leaves the fanout's reader time to get over the request it
	// lost with its connection (a second) before a revision comes again.
	f, _ := b.runFanout(fanout.Config{Delay: 50 * time.Millisecond, AckWait: 2 * time.Second},
		natsURL(px.url()), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	received, lost := 0, 0
	// lostInFlight writes a change of zoe's while the fanout's connection
	// loses what it sends, cuts the connection once the fanout has
	// acknowledged the change into the loss, runs more (each writes one
	// revision), and waits for the change to be delivered again.
	lostInFlight := func(change func(*presence.Record), more ...func()) uint64 {
		t.Helper()
		b.loseFanout(px)
		_, rev := b.update("zoe", change)
		received++
		lost++
		natstest.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
			if px.lost("$JS.ACK.") < lost {
				return errors.New("the fanout has not acknowledged the revision yet")
			}
			return nil
		})
		px.Cut()
		for _, write := range more {
			write()
			received++
		}
		received++ // the lost revision, again once AckWait has passed
		natstest.CheckFor(t, 20*time.Second, time.Millisecond, func() error {
			if v, _ := metricstest.Value(f.Registry(), "greendot_fanout_revisions_total"); v < float64(received) {
				return fmt.Errorf("%v revisions received, want %d", v, received)
			}
			return nil
		})
		return rev
	}
	// publishedAgain checks that zoe's revision rev was published, as
	// status, before a change written after its redelivery.
	publishedAgain := func(rev uint64, status presence.Status) {
		t.Helper()
		mark := fmt.Sprint("mark", rev)
		_, after := b.update(mark, func(r *presence.Record) { r.SetConn("m1", presence.ConnInfo{Gateway: "gw3"}) })
		received++
		if ev := b.nextEvent(); ev.UserID != "zoe" || ev.Rev != rev || ev.Status != status {
			t.Fatalf("event = %+v, want zoe %s at %d, published again", ev, status, rev)
		}
		if ev := b.nextEvent(); ev.UserID != mark || ev.Rev != after {
			t.Fatalf("event = %+v, want %s's at %d", ev, mark, after)
		}
	}

	// Delivered again after a newer revision, which changed only her
	// devices, went out on the connection made again.
	rev := lostInFlight(func(r *presence.Record) { r.SetConn("z1", presence.ConnInfo{Gateway: "gw1"}) }, func() {
		_, rev := b.update("zoe", func(r *presence.Record) { r.SetConn("z2", presence.ConnInfo{Gateway: "gw2"}) })
		if self := next[presence.SelfEvent](t, gw2); self.UserID != "zoe" || self.Rev != rev || self.Devices != 2 {
			t.Fatalf("self event = %+v, want zoe's 2 devices at %d", self, rev)
		}
		if v, _ := metricstest.Value(f.Registry(), "greendot_fanout_revisions_total"); v != 2 {
			t.Fatalf("%v revisions received by the time the newer one was handled, want 2: the first came again before it", v)
		}
	})
	publishedAgain(rev, presence.Online)

	// Delivered again as the newest revision the fanout handled.
	rev = lostInFlight(func(r *presence.Record) { r.Chosen = presence.Busy })
	publishedAgain(rev, presence.Busy)
	if self := next[presence.SelfEvent](t, gw2); self.UserID != "zoe" || self.Rev != rev || self.Status != presence.Busy {
		t.Errorf("self event = %+v, want zoe busy at %d", self, rev)
	}
}

// loseFanout has the fanout's connection through px lose what the fanout
// sends from the moment its pull request waits on the server: revisions
// still reach it.
func (b *bench) loseFanout(px *lossyProxy) {
	b.t.Helper()
	natstest.CheckFor(b.t, 10*time.Second, time.Millisecond, func() error {
		info, err := b.fanoutConsumer()
		if err != nil {
			return err
		}
		if info.NumWaiting == 0 {
			return errors.New("no pull request waits")
		}
		return nil
	})
	px.lose()
}

// natsURL has a fanout connect to url rather than the bench's server.
func natsURL(url string) nats.Option {
	return func(o *nats.Options) error {
		o.Url, o.Servers = url, nil
		return nil
	}
}

// lossyProxy passes TCP connections through to a NATS server. lose makes
// the connections open at the time lose what their clients send, as a
// connection that dies with bytes in flight does, until Cut closes
// them; connections made after pass everything.
type lossyProxy struct {
	*tcpproxy.Proxy

	mu     sync.Mutex
	losing map[*tcpproxy.Link]bool
	lostTo strings.Builder // what the lost connections' clients sent
}

func startLossyProxy(t *testing.T, target string) *lossyProxy {
	t.Helper()
	p := &lossyProxy{losing: make(map[*tcpproxy.Link]bool)}
	p.Proxy = tcpproxy.Start(t, target, func(l *tcpproxy.Link) (toServer, _ tcpproxy.Filter) {
		return func(b []byte) []byte { return p.upstream(l, b) }, nil
	})
	return p
}

func (p *lossyProxy) url() string { return "nats://" + p.Addr() }

// upstream passes what the client of l sends to the server, or, once l is
// losing, notes it and drops it.
func (p *lossyProxy) upstream(l *tcpproxy.Link, b []byte) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.losing[l] {
		return b
	}
	p.lostTo.Write(b)
	return nil
}

// lose makes the open connections lose what their clients send.
func (p *lossyProxy) lose() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.Links() {
		p.losing[l] = true
	}
}

// lost returns how many times s is in what the clients sent that was
// lost.
func (p *lossyProxy) lost(s string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Count(p.lostTo.String(), s)
}

// fanoutConsumer returns the state of the fanouts' durable consumer.
func (b *bench) fanoutConsumer() (*jetstream.ConsumerInfo, error) {
	js, err := jetstream.New(b.nc)
	if err != nil {
		return nil, err
	}
	c, err := js.Consumer(context.Background(), presence.StreamName(presence.StatusBucket), presence.FanoutConsumer)
	if err != nil {
		return nil, err
	}
	return c.Info(context.Background())
}

// TestSeveralFanoutsRepeatNothing: with two fanouts sharing the consumer,
// each handles some of a user's revisions. One that did not handle the
// revision that last moved the public view still publishes nothing for a
// later one that left it as it was (a second device): its record says
// since when the view has not moved. An event repeating the state would
// tell watchers, of an invisible user too, when their devices come and go.
// (An event of a revision that moved the view may come twice, from its
// writer and a fanout that had not seen its report yet: gateways drop the
// second.)
func TestSeveralFanoutsRepeatNothing(t *testing.T) {
	b := newBench(t, nil)
	cfg := fanout.Config{Delay: 100 * time.Millisecond}
	b.startFanout(cfg)
	b.startFanout(cfg)
	pub := presence.NewPublisher(b.nc)
	t.Cleanup(pub.Close)
	ctx := context.Background()
	write := func(user string, mutate func(*presence.Record)) uint64 {
		t.Helper()
		w, err := b.store.WriteStatus(ctx, user, &presence.Cached{}, func(r *presence.Record) error {
			mutate(r)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Publish(user, &w, false); err != nil {
			t.Fatal(err)
		}
		return w.Rev
	}
	const users = 40
	moved, unmoved := map[uint64]bool{}, map[uint64]bool{}
	for i := range users {
		user := fmt.Sprintf("u%d", i)
		// Online, then invisible: the public view moves twice...
		moved[write(user, func(r *presence.Record) { r.SetConn("c1", presence.ConnInfo{Gateway: "gw1", Lease: "E"}) })] = true
		moved[write(user, func(r *presence.Record) { r.Chosen = presence.Invisible })] = true
		// ...and a second device leaves it as it was.
		unmoved[write(user, func(r *presence.Record) { r.SetConn("c2", presence.ConnInfo{Gateway: "gw2", Lease: "E"}) })] = true
	}
	// Every revision handled: whatever a fanout published is on its way.
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		info, err := b.fanoutConsumer()
		if err != nil {
			return err
		}
		if info.NumPending > 0 || info.NumAckPending > 0 {
			return fmt.Errorf("%d revisions to hand out, %d being handled", info.NumPending, info.NumAckPending)
		}
		return nil
	})
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for {
		m, err := b.events.NextMsg(time.Second)
		if errors.Is(err, nats.ErrTimeout) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var ev presence.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if unmoved[ev.Rev] {
			t.Errorf("event %+v of a revision that left the public view as it was", ev)
		}
		seen[ev.Rev] = true
	}
	for rev := range moved {
		if !seen[rev] {
			t.Errorf("no event of revision %d, which moved the public view", rev)
		}
	}
}
