package presence_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// TestPublisherReports: a Publisher reports the newest revision of each
// user's public and of its self events it published, in one report after
// the events; a write that wrote nothing is neither published nor reported.
func TestPublisherReports(t *testing.T) {
	store, nc := openStore(t, presence.BucketOptions{})
	sub, err := nc.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	pub := presence.NewPublisher(nc)
	defer pub.Close()

	var revs []uint64
	for i := range 3 {
		w, err := store.WriteStatus(context.Background(), "alice", &presence.Cached{}, func(r *presence.Record) error {
			r.SetConn(fmt.Sprint("a", i), presence.ConnInfo{Gateway: "gw1", Lease: "E"})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := pub.Publish("alice", &w, false); err != nil || n == 0 {
			t.Fatalf("published %d, %v", n, err)
		}
		revs = append(revs, w.Rev)
	}
	if n, err := pub.Publish("bob", &presence.Write{}, false); err != nil || n != 0 {
		t.Fatalf("a write that wrote nothing published %d, %v", n, err)
	}

	// The events come first, then one report with the newest revisions.
	var events int
	for {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no report: %v", err)
		}
		if m.Subject == presence.EventSubject("alice") || m.Subject == presence.SelfSubject("gw1") {
			events++
			continue
		}
		if m.Subject != presence.PublishedSubject {
			continue // the bucket's own messages
		}
		var rep presence.Published
		if err := json.Unmarshal(m.Data, &rep); err != nil {
			t.Fatal(err)
		}
		// Only the first write changed what others see (online); every
		// write changed her devices.
		if !maps.Equal(rep.Pub, map[string]uint64{"alice": revs[0]}) || !maps.Equal(rep.Self, map[string]uint64{"alice": revs[2]}) {
			t.Errorf("report = %+v, want alice's public event at %d and self event at %d", rep, revs[0], revs[2])
		}
		if events == 0 {
			t.Error("the report came before the events")
		}
		break
	}
}

// TestPublisherReportsNothingAcrossReconnects: events published on a
// connection that was made again before their report are not reported, so
// the fanout publishes them; those published after it are.
func TestPublisherReportsNothingAcrossReconnects(t *testing.T) {
	srv := natstest.RunServer(t)
	reconnected := make(chan struct{}, 1)
	nc := natstest.Connect(t, srv, nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	watch := natstest.Connect(t, srv)
	reports, err := watch.SubscribeSync(presence.PublishedSubject)
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	store, err := presence.Open(context.Background(), nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pub := presence.NewPublisherEvery(nc, time.Hour) // reports only on Close
	write := func(user string) uint64 {
		t.Helper()
		w, err := store.WriteStatus(context.Background(), user, &presence.Cached{}, func(r *presence.Record) error {
			r.SetConn("c1", presence.ConnInfo{Gateway: "gw1", Lease: "E"})
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

	write("before")
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reconnected:
	case <-time.After(20 * time.Second):
		t.Fatal("no reconnect within 20s")
	}
	rev := write("after")
	pub.Close()

	rep := nextReport(t, reports)
	if !maps.Equal(rep.Pub, map[string]uint64{"after": rev}) || !maps.Equal(rep.Self, map[string]uint64{"after": rev}) {
		t.Errorf("report = %+v, want only the events published after the reconnect (at %d)", rep, rev)
	}
}

// TestPublisherHandsOver: with HandOver, the self event for the local
// gateway goes to its function and not to NATS, for the writes Publish is
// told may hand it over; the other gateways' go to NATS, and the report
// names the self event all the same.
func TestPublisherHandsOver(t *testing.T) {
	store, nc := openStore(t, presence.BucketOptions{})
	selfs, err := nc.SubscribeSync(presence.SelfSubject("*"))
	if err != nil {
		t.Fatal(err)
	}
	reports, err := nc.SubscribeSync(presence.PublishedSubject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	pub := presence.NewPublisherEvery(nc, time.Hour) // reports only on Close
	var handed []presence.SelfEvent
	pub.HandOver("gw1", func(ev *presence.SelfEvent) { handed = append(handed, *ev) })

	var cache presence.Cached
	write := func(conn, gw string) presence.Write {
		t.Helper()
		w, err := store.WriteStatus(context.Background(), "alice", &cache, func(r *presence.Record) error {
			r.SetConn(conn, presence.ConnInfo{Gateway: gw, Lease: "E"})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	nextSelf := func() string {
		t.Helper()
		m, err := selfs.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no self event: %v", err)
		}
		return m.Subject
	}

	write("a1", "gw2")
	w := write("a2", "gw1")
	// Published with the hand-over: gw1's self event is handed over, gw2's
	// is published (what others see did not change: no public event).
	if n, err := pub.Publish("alice", &w, true); err != nil || n != 1 {
		t.Fatalf("published %d, %v; want 1, nil", n, err)
	}
	want := presence.SelfEvent{UserID: "alice", Status: presence.Online, Devices: 2, Rev: w.Rev}
	if len(handed) != 1 || handed[0] != want {
		t.Fatalf("handed over %+v, want [%+v]", handed, want)
	}
	if got := nextSelf(); got != presence.SelfSubject("gw2") {
		t.Errorf("self event on %s, want only gw2's", got)
	}

	// Without it, both gateways' self events go to NATS.
	w = write("a3", "gw1")
	if n, err := pub.Publish("alice", &w, false); err != nil || n != 2 {
		t.Fatalf("published %d, %v; want 2, nil", n, err)
	}
	if len(handed) != 1 {
		t.Errorf("handed over %+v without being told it may", handed[1:])
	}
	got := map[string]bool{nextSelf(): true, nextSelf(): true}
	if !got[presence.SelfSubject("gw1")] || !got[presence.SelfSubject("gw2")] {
		t.Errorf("self events on %v, want gw1's and gw2's", got)
	}

	pub.Close()
	if rep := nextReport(t, reports); rep.Self["alice"] != w.Rev {
		t.Errorf("report = %+v, want alice's self event at %d", rep, w.Rev)
	}
	// The server delivers what was published before it answers a ping on
	// the same connection.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := selfs.Pending(); n != 0 {
		t.Errorf("%d self events more", n)
	}
}

// nextReport returns the next report sub receives.
func nextReport(t *testing.T, sub *nats.Subscription) presence.Published {
	t.Helper()
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no report: %v", err)
	}
	var rep presence.Published
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestSplitReport(t *testing.T) {
	rep := presence.Published{Pub: map[string]uint64{}, Self: map[string]uint64{}}
	for i := range 13 {
		rep.Pub[fmt.Sprint("u", i)] = uint64(i + 1)
	}
	for i := range 12 {
		rep.Self[fmt.Sprint("u", i)] = uint64(i + 100)
	}
	parts := presence.Split(rep, 10)
	if len(parts) != 3 {
		t.Fatalf("%d parts, want 3", len(parts))
	}
	joined := presence.Published{Pub: map[string]uint64{}, Self: map[string]uint64{}}
	for _, p := range parts {
		if p.Len() > 10 {
			t.Errorf("a part of %d entries, want at most 10", p.Len())
		}
		maps.Copy(joined.Pub, p.Pub)
		maps.Copy(joined.Self, p.Self)
	}
	if !maps.Equal(joined.Pub, rep.Pub) || !maps.Equal(joined.Self, rep.Self) {
		t.Errorf("parts joined = %+v, want %+v", joined, rep)
	}
	if parts := presence.Split(rep, 100); len(parts) != 1 || parts[0].Len() != 25 {
		t.Errorf("a report within the bound was split: %+v", parts)
	}
}
