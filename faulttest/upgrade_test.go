package faulttest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/presence"
)

// oldConn is a connection of a gateway of the earlier kind, as that
// gateway kept it: a key "<user>.<conn>" with a TTL it refreshed while
// heartbeats arrived, and an entry in the user's record naming the key's
// revision. Such a gateway published no events.
type oldConn struct {
	user, conn string
	stop       chan struct{}
	done       chan struct{}
}

// startOldConn registers a connection as an earlier gateway did and keeps
// its key alive, every ttl/3, until stopped.
func startOldConn(tb testing.TB, store *presence.Store, user, conn string, ttl time.Duration) *oldConn {
	tb.Helper()
	ctx := context.Background()
	now := time.Now().UnixMilli()
	rec := presence.ConnRecord{Gateway: "gw-old", Since: now, ActiveAt: now, AwayAt: now + time.Hour.Milliseconds()}
	rev, err := store.CreateConn(ctx, user, conn, rec, ttl+time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	if _, _, _, err := store.UpdateStatus(ctx, user, func(r *presence.Record) error {
		r.SetConn(conn, presence.ConnInfo{Gateway: "gw-old", Since: now, Rev: rev})
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	c := &oldConn{user: user, conn: conn, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		tick(c.stop, ttl/3, func() bool {
			r, err := store.WriteConn(ctx, user, conn, rec, ttl+time.Second, rev)
			if err != nil {
				tb.Errorf("refresh %s.%s: %v", user, conn, err)
				return false
			}
			rev = r
			return true
		})
	}()
	tb.Cleanup(c.halt)
	return c
}

// halt stops refreshing the key: its gateway died.
func (c *oldConn) halt() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

// closeCleanly ends the connection as an earlier gateway did on a clean
// close: the key rewritten as closing, with the offline grace as its TTL.
func (c *oldConn) closeCleanly(tb testing.TB, store *presence.Store, grace time.Duration) {
	tb.Helper()
	c.halt()
	ctx := context.Background()
	rec, rev, err := store.Conn(ctx, c.user, c.conn)
	if err != nil {
		tb.Fatal(err)
	}
	rec.Closing, rec.AwayAt = true, 0
	if _, err := store.WriteConn(ctx, c.user, c.conn, rec, grace, rev); err != nil {
		tb.Fatal(err)
	}
}

// TestUpgradeInPlace runs the processes of this version on the state an
// earlier version left (connection keys of the earlier shape, kept alive by
// their gateway's refreshes) while that gateway still runs: its users stay
// online while it refreshes their keys; a user who moves to a new gateway
// (a drain) is never shown offline while the old connection lives out its
// grace; and a user whose old gateway dies goes offline when the key
// expires, although no event comes from that gateway.
func TestUpgradeInPlace(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 1)
	store := cl.openStore(1)
	tm := timings{ttl: time.Second, heartbeat: 300 * time.Millisecond, grace: time.Second, ackWait: 3 * time.Second, replicas: 1}

	// The earlier gateway's users, online before the upgrade.
	mover := startOldConn(t, store, "mover", "m-old", tm.ttl)
	victim := startOldConn(t, store, "victim", "v-old", tm.ttl)
	stayer := startOldConn(t, store, "stayer", "s-old", tm.ttl)

	// The processes of this version: reaper, fanout, gateway.
	startReaper(t, cl.urlsAs("reaper"), "reaper", tm)
	startFanout(t, cl.urlsAs("fanout"), "fanout", tm)
	gw := startGateway(t, cl.urlsAs("gateway"), "gw-new", tm)
	users := []string{"mover", "victim", "stayer", "fresh"}
	mutual(t, store, []string{"watcher"}, users)
	w := dialClient(t, "watcher", []string{gw.WS}, tm.heartbeat, false)
	w.subscribe(users...)
	want := truth{"mover": presence.Online, "victim": presence.Online, "stayer": presence.Online, "fresh": presence.Offline}
	expectViews(t, 15*time.Second, "the earlier gateway's users online", []*liveClient{w}, want)

	// A user of this version's gateway, beside them.
	dialClient(t, "fresh", []string{gw.WS}, tm.heartbeat, false)
	want["fresh"] = presence.Online
	expectViews(t, 15*time.Second, "fresh online", []*liveClient{w}, want)
	watching := time.Now()

	// The earlier gateway drains mover: the client connects to the new
	// gateway, the old connection is closed cleanly and lives out its
	// grace.
	dialClient(t, "mover", []string{gw.WS}, tm.heartbeat, false)
	mover.closeCleanly(t, store, tm.grace)

	// The earlier gateway dies with victim: its key expires.
	victim.halt()
	want["victim"] = presence.Offline
	expectViews(t, 15*time.Second, "victim offline once its key expired", []*liveClient{w}, want)

	// The old connection of mover is gone from its record, the new one
	// stays; stayer's earlier gateway still refreshes it.
	ctx := context.Background()
	waitFor(t, 15*time.Second, "records", func() error {
		m, _, err := store.Status(ctx, "mover")
		if err != nil {
			return err
		}
		if _, old := m.Conns["m-old"]; old || len(m.Conns) != 1 {
			return fmt.Errorf("mover's record: %+v, want only the new connection", m.Conns)
		}
		s, _, err := store.Status(ctx, "stayer")
		if err != nil {
			return err
		}
		if s.Status != presence.Online || len(s.Conns) != 1 {
			return fmt.Errorf("stayer's record: %+v, want online on the earlier gateway", s)
		}
		return nil
	})
	expectViews(t, 5*time.Second, "after the move", []*liveClient{w}, want)
	neverOffline(t, []*liveClient{w}, []string{"mover", "stayer", "fresh"}, watching, time.Now())
	stayer.halt()
}
