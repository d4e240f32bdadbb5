package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
)

// TestAliceQuestion answers "is alice online, on which devices, since
// when, and who is watching her?" the way the page says, and checks each
// answer against what the test did.
func TestAliceQuestion(t *testing.T) {
	sc := startScene(t)
	ctx := context.Background()
	before := time.Now()

	// Online, devices, since: nats req greendot.gateway.conns alice.
	r, err := adminclient.Conns(ctx, sc.nc, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != presence.Online || r.Public != presence.Online || r.Devices != 2 {
		t.Errorf("alice: status %s, public %s, %d devices; want online on 2", r.Status, r.Public, r.Devices)
	}
	devices := map[string]admin.ConnInfo{}
	for _, c := range r.Conns {
		devices[c.Device] = c
	}
	for dev, want := range map[string]struct {
		conn *client.Conn
		gw   string
	}{"web": {sc.aliceWeb, sc.gw1.ID()}, "ios": {sc.aliceIOS, sc.gw2.ID()}} {
		c, ok := devices[dev]
		switch {
		case !ok:
			t.Errorf("no %s device in %+v", dev, r.Conns)
		case c.ConnID != want.conn.Hello.ConnID || c.Gateway != want.gw || !c.KeyLive || !c.InRecord:
			t.Errorf("%s: %+v, want conn %s on %s, live", dev, c, want.conn.Hello.ConnID, want.gw)
		case c.Since.After(before) || before.Sub(c.Since) > time.Minute:
			t.Errorf("%s: since %v, want shortly before %v", dev, c.Since, before)
		}
	}
	if r.Since == nil || r.Since.After(before) {
		t.Errorf("alice online since %v, want before %v", r.Since, before)
	}

	// The same from the buckets: nats kv get presence_status alice, and
	// nats kv ls presence_conns '*.*.alice.*'.
	js, err := jetstream.New(sc.nc)
	if err != nil {
		t.Fatal(err)
	}
	status, err := js.KeyValue(ctx, presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := status.Get(ctx, presence.StatusKey("alice"))
	if err != nil {
		t.Fatal(err)
	}
	var rec presence.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Status != presence.Online || rec.Devices != 2 || len(rec.Conns) != 2 || rec.Since != r.Since.UnixMilli() {
		t.Errorf("record = %+v, want what conns said (%+v)", rec, r)
	}
	conns, err := js.KeyValue(ctx, presence.ConnsBucket)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := conns.ListKeysFiltered(ctx, presence.UserConnsFilter("alice"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var want []string
	for _, c := range []*client.Conn{sc.aliceWeb, sc.aliceIOS} {
		ci := rec.Conns[c.Hello.ConnID]
		want = append(want, presence.LeaseConnKey(ci.Gateway, ci.Lease, "alice", c.Hello.ConnID))
	}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("alice's keys = %v, want %v", keys, want)
	}

	// Who is watching her: nats req --replies=0 greendot.gateway.watchers alice.
	ws, err := adminclient.Watchers(ctx, sc.nc, "alice", 5*time.Second)
	if err != nil || len(ws) != 2 {
		t.Fatalf("watchers = %+v, %v, want a reply per gateway", ws, err)
	}
	var watchers []string
	for _, rep := range ws {
		for _, w := range rep.Watchers {
			watchers = append(watchers, rep.Gateway+"/"+w.UserID+"/"+w.ConnID)
		}
		if rep.Subscribed != (rep.Gateway == sc.gw1.ID()) {
			t.Errorf("gateway %s subscribed = %v", rep.Gateway, rep.Subscribed)
		}
	}
	if w := sc.gw1.ID() + "/bob/" + sc.bob.Hello.ConnID; !slices.Equal(watchers, []string{w}) {
		t.Errorf("watchers = %v, want [%s]", watchers, w)
	}

	// The NATS view: the monitoring port's subsz names the connections
	// with interest in presence.event.alice (the gateway whose socket
	// watches her; the fanout reads the writers' reports instead), and
	// connz says whose they are; the fanout's is on presence.published.
	mon := "http://" + sc.srv.MonitorAddr().String()
	var subsz server.Subsz
	getJSON(t, mon+"/subsz?subs=1&test="+presence.EventSubject("alice"), &subsz)
	bySubject := map[string]uint64{}
	for _, sub := range subsz.Subs {
		bySubject[sub.Subject] = sub.Cid
	}
	if len(subsz.Subs) != 1 || bySubject[presence.EventSubject("alice")] == 0 {
		t.Fatalf("subsz = %+v, want one subscription, on %s", subsz.Subs, presence.EventSubject("alice"))
	}
	getJSON(t, mon+"/subsz?subs=1&test="+presence.PublishedSubject, &subsz)
	for _, sub := range subsz.Subs {
		bySubject[sub.Subject] = sub.Cid
	}
	if len(subsz.Subs) != 1 || bySubject[presence.PublishedSubject] == 0 {
		t.Fatalf("subsz = %+v, want the fanout's subscription on %s", subsz.Subs, presence.PublishedSubject)
	}
	for subject, name := range map[string]string{presence.EventSubject("alice"): "systest gateway", presence.PublishedSubject: "ops fanout"} {
		var connz server.Connz
		getJSON(t, mon+"/connz?cid="+strconv.FormatUint(bySubject[subject], 10), &connz)
		if len(connz.Conns) != 1 || connz.Conns[0].Name != name {
			t.Errorf("connz of the subscriber on %s = %+v, want %q", subject, connz.Conns, name)
		}
	}

	// Who may watch her: the follow edges.
	graph, err := js.KeyValue(ctx, presence.GraphBucket)
	if err != nil {
		t.Fatal(err)
	}
	lister, err = graph.ListKeysFiltered(ctx, presence.FollowersFilter("alice"))
	if err != nil {
		t.Fatal(err)
	}
	var followers []string
	for k := range lister.Keys() {
		a, _, _ := presence.ParseFollowKey(k)
		followers = append(followers, a)
	}
	slices.Sort(followers)
	if !slices.Equal(followers, []string{"bob", "carol"}) {
		t.Errorf("followers of alice = %v, want [bob carol]", followers)
	}
}

// TestKickRecipe kicks alice as the page says, and checks her sockets got
// the close it describes and her watcher saw her go offline.
func TestKickRecipe(t *testing.T) {
	sc := startScene(t)
	ctx := context.Background()
	msgs, err := adminclient.Gather(ctx, sc.nc, admin.GatewayKickSubject, []byte("alice"), adminclient.GatherOptions{Timeout: 2 * time.Second})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("kick: %d replies, %v, want one per gateway", len(msgs), err)
	}
	for _, c := range []*client.Conn{sc.aliceWeb, sc.aliceIOS} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var closed *client.CloseError
		for range 1000 {
			_, _, err := c.Read()
			if err != nil {
				if !errors.As(err, &closed) {
					t.Fatalf("read: %v, want a close frame", err)
				}
				break
			}
		}
		if closed == nil || closed.Code != admin.ClosePolicy || closed.Reason != admin.DefaultKickReason {
			t.Errorf("close = %+v, want 1008 %q", closed, admin.DefaultKickReason)
		}
	}
	sc.bobView.Await("alice", presence.Offline)
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		r, err := adminclient.Conns(ctx, sc.nc, "alice")
		if err != nil {
			return err
		}
		if r.Status != presence.Offline || len(r.Conns) != 0 {
			return fmt.Errorf("alice after the kick: %+v", r)
		}
		return nil
	})
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %s", url, resp.Status, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
