package faulttest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
)

// roomSocket is a socket in one room that keeps what its room frames say:
// the room's connections, and when each was last seen leaving.
type roomSocket struct {
	c *client.Conn

	mu     sync.Mutex
	conns  map[string]string    // connection id to user id
	leftAt map[string]time.Time // connection id
}

// joinRoomAs connects user to url, keeps the socket alive, joins room, and
// follows the room's frames until the test ends.
func joinRoomAs(t *testing.T, url, user, room string, heartbeat time.Duration) *roomSocket {
	t.Helper()
	c, err := client.Dial(context.Background(), url+"?user="+user, client.Options{})
	if err != nil {
		t.Fatalf("dial %s as %s: %v", url, user, err)
	}
	rs := &roomSocket{c: c, conns: map[string]string{}, leftAt: map[string]time.Time{}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(heartbeat)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				_ = c.Heartbeat()
			}
		}
	})
	wg.Go(func() {
		for {
			m, _, err := c.Read()
			if err != nil {
				return
			}
			rs.take(m)
		}
	})
	t.Cleanup(func() {
		close(done)
		_ = c.Abort()
		wg.Wait()
	})
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeJoin, ID: "j", Room: room}); err != nil {
		t.Fatal(err)
	}
	return rs
}

func (rs *roomSocket) take(m protocol.ServerMessage) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch m.Type {
	case protocol.TypeRoomState:
		for _, mb := range m.Members {
			for _, rc := range mb.Conns {
				rs.conns[rc.ConnID] = mb.UserID
			}
		}
	case protocol.TypeRoomDiff:
		for _, mb := range m.Leaves {
			for _, rc := range mb.Conns {
				delete(rs.conns, rc.ConnID)
				rs.leftAt[rc.ConnID] = time.Now()
			}
		}
		for _, mb := range m.Joins {
			for _, rc := range mb.Conns {
				rs.conns[rc.ConnID] = mb.UserID
			}
		}
	}
}

// has reports whether the socket sees conn in the room, and when it saw
// it leave last.
func (rs *roomSocket) has(conn string) (bool, time.Time) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	_, in := rs.conns[conn]
	return in, rs.leftAt[conn]
}

// TestRoomGatewayKilled kills a gateway process with SIGKILL while its
// connections are in a room. The room's watchers on another gateway see
// them leave within the lease TTL plus 2 s, as presence says of users; a
// member on the live gateway never leaves; and the dead gateway's room
// keys are gone. The gateways and the reaper run as their NATS users.
func TestRoomGatewayKilled(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 1)
	store := cl.openStore(1)
	tm := timings{ttl: time.Second, heartbeat: 300 * time.Millisecond, grace: time.Second, ackWait: 5 * time.Second, replicas: 1}
	startReaper(t, cl.urlsAs("reaper"), "reaper", tm)
	doomed, doomedWS := startChildGateway(t, cl, "gwdoomed", tm)
	kept := startGateway(t, cl.urlsAs("gateway"), "gwkept", tm)

	const room = "doc:42"
	watcher := joinRoomAs(t, kept.WS, "w", room, tm.heartbeat)
	onKept := joinRoomAs(t, kept.WS, "k1", room, tm.heartbeat)
	var onDoomed []*roomSocket
	for i := range 3 {
		onDoomed = append(onDoomed, joinRoomAs(t, doomedWS, fmt.Sprintf("d%d", i), room, tm.heartbeat))
	}
	waitFor(t, 15*time.Second, "every member seen by the watcher", func() error {
		for _, s := range append([]*roomSocket{onKept}, onDoomed...) {
			if in, _ := watcher.has(s.c.Hello.ConnID); !in {
				return fmt.Errorf("the watcher does not see %s", s.c.Hello.UserID)
			}
		}
		return nil
	})

	killedAt := time.Now()
	kill(t, doomed)
	limit := tm.ttl + 2*time.Second
	waitFor(t, 30*time.Second, "the killed gateway's members gone", func() error {
		for _, s := range onDoomed {
			if in, _ := watcher.has(s.c.Hello.ConnID); in {
				return fmt.Errorf("the watcher still sees %s", s.c.Hello.UserID)
			}
		}
		return nil
	})
	var longest time.Duration
	for _, s := range onDoomed {
		_, at := watcher.has(s.c.Hello.ConnID)
		took := at.Sub(killedAt)
		longest = max(longest, took)
		if took > limit {
			t.Errorf("%s left the room %v after the kill, over %v", s.c.Hello.UserID, took, limit)
		}
	}
	t.Logf("the killed gateway's members left the room at most %v after the kill (limit %v)", longest.Round(time.Millisecond), limit)
	if in, at := watcher.has(onKept.c.Hello.ConnID); !in || !at.IsZero() {
		t.Errorf("the live gateway's member left the room (in %v, left at %v)", in, at)
	}
	waitFor(t, 30*time.Second, "the killed gateway's room keys gone", func() error {
		entries, err := store.RoomMembers(context.Background(), room)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Member.Gateway == "gwdoomed" {
				return fmt.Errorf("key %s left", e.Member.Key())
			}
		}
		if len(entries) != 2 {
			return fmt.Errorf("room keys %+v: want the watcher's and k1's", entries)
		}
		return nil
	})
}
