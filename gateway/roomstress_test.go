package gateway_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// roomTruth is the test's own record of which connection is in which
// room: what the clients asked for, and were not closed since.
type roomTruth struct {
	mu    sync.Mutex
	rooms map[string]map[string]bool // room, connection
}

func (rt *roomTruth) set(room, conn string, in bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.rooms[room] == nil {
		rt.rooms[room] = map[string]bool{}
	}
	if in {
		rt.rooms[room][conn] = true
	} else {
		delete(rt.rooms[room], conn)
	}
}

func (rt *roomTruth) conns(room string) []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []string
	for c := range rt.rooms[room] {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// roomClient is one stress client: a socket kept alive and drained, whose
// answers (frames with an id) are handed to the worker.
type roomClient struct {
	c       *client.Conn
	stop    func()
	read    sync.WaitGroup
	rooms   []string
	answers chan protocol.ServerMessage
}

func dialRoomClient(g *systest.Gateway, user string) (*roomClient, error) {
	c, err := client.Dial(context.Background(), g.WS+"?user="+user, client.Options{})
	if err != nil {
		return nil, err
	}
	rc := &roomClient{c: c, stop: systest.KeepAlive(c, systest.Heartbeat), answers: make(chan protocol.ServerMessage, 16)}
	rc.read.Go(func() {
		for {
			m, _, err := c.Read()
			if err != nil {
				return
			}
			if m.ID != "" {
				rc.answers <- m
			}
		}
	})
	return rc, nil
}

// join joins a room and waits for the answer, as a client does before it
// counts itself in: a join refused (too many requests waiting) is not a
// membership.
func (rc *roomClient) join(id, room string) error {
	if err := rc.c.Send(protocol.ClientMessage{Type: protocol.TypeJoin, ID: id, Room: room}); err != nil {
		return err
	}
	select {
	case m := <-rc.answers:
		if m.Type != protocol.TypeRoomState || m.ID != id || m.Room != room {
			return fmt.Errorf("join %s: answered %+v", room, m)
		}
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("join %s: no answer", room)
	}
}

// end closes the client cleanly, or aborts it (a silent death).
func (rc *roomClient) end(abort bool) {
	rc.stop()
	if abort {
		_ = rc.c.Abort()
	} else {
		_ = rc.c.Close()
		_ = rc.c.Abort()
	}
	rc.read.Wait()
}

// TestRoomStress: clients on two gateways join and leave a few rooms,
// close, die and reconnect, concurrently; then every gateway's member
// table of each room, and the room's keys, are the connections that are
// in it by the test's own record.
func TestRoomStress(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gws := []*systest.Gateway{sys.Gateway(), sys.StartGateway(gateway.Config{})}
	rooms := []string{"doc:1", "doc:2", "game:3:lobby"}
	truth := &roomTruth{rooms: map[string]map[string]bool{}}

	// An observer per gateway and room keeps a table of every room on
	// every gateway.
	for _, g := range gws {
		for _, r := range rooms {
			o := dialKept(t, sys, g, "observer")
			joinRoom(t, o, "o", r, "")
			truth.set(r, o.Hello.ConnID, true)
		}
	}

	const workers, ops = 12, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			user := fmt.Sprintf("u%d", w%8)
			var rc *roomClient
			leaveAll := func() {
				for _, r := range rc.rooms {
					truth.set(r, rc.c.Hello.ConnID, false)
				}
			}
			for i := range ops {
				if rc == nil {
					var err error
					if rc, err = dialRoomClient(gws[rng.IntN(len(gws))], user); err != nil {
						t.Errorf("worker %d: %v", w, err)
						return
					}
				}
				r := rooms[rng.IntN(len(rooms))]
				switch n := rng.IntN(10); {
				case n < 5:
					if err := rc.join(fmt.Sprint(i), r); err != nil {
						t.Errorf("worker %d: %v", w, err)
						return
					}
					if !slices.Contains(rc.rooms, r) {
						rc.rooms = append(rc.rooms, r)
					}
					truth.set(r, rc.c.Hello.ConnID, true)
				case n < 8:
					rc.rooms = slices.DeleteFunc(rc.rooms, func(x string) bool { return x == r })
					truth.set(r, rc.c.Hello.ConnID, false)
					_ = rc.c.Send(protocol.ClientMessage{Type: protocol.TypeLeave, Room: r})
				default:
					leaveAll()
					rc.end(n == 9)
					rc = nil
				}
			}
			if rc != nil {
				t.Cleanup(func() { rc.end(true) })
			}
		})
	}
	wg.Wait()

	// Ended connections leave after the grace or the TTL: be patient, on
	// a loaded machine too.
	for _, r := range rooms {
		want := truth.conns(r)
		natstest.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
			for i, g := range gws {
				if got := g.RoomConns(r); !slices.Equal(got, want) {
					return fmt.Errorf("room %s on gateway %d: %d connections %v, want %d %v", r, i, len(got), got, len(want), want)
				}
			}
			return nil
		})
		natsCheckRoom(t, sys, r, want)
	}
}
