//go:build linux

package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/systest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
)

// sloth is a client that stops reading: it reads what it must to set
// itself up, then only writes. Its socket's receive buffer is small, set
// before it connects, so that the gateway's side fills up soon.
type sloth struct {
	nc net.Conn
	rw io.ReadWriter
}

// dialSloth connects user to g with dev auth.
func dialSloth(t *testing.T, g *systest.Gateway, user string) *sloth {
	t.Helper()
	d := ws.Dialer{
		Timeout: 10 * time.Second,
		NetDial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nd := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
				}); err != nil {
					return err
				}
				return serr
			}}
			return nd.DialContext(ctx, network, addr)
		},
	}
	nc, br, _, err := d.Dial(context.Background(), g.WS+"?user="+user)
	if err != nil {
		t.Fatalf("dial %s: %v", user, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	var r io.Reader = nc
	if br != nil {
		r = io.MultiReader(br, nc)
	}
	s := &sloth{nc: nc, rw: struct {
		io.Reader
		io.Writer
	}{bufio.NewReader(r), nc}}
	s.await(t, func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeHello })
	return s
}

// send writes one message.
func (s *sloth) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_ = s.nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
	return wsutil.WriteClientText(s.nc, b)
}

// await reads until a message matches.
func (s *sloth) await(t *testing.T, match func(protocol.ServerMessage) bool) {
	t.Helper()
	_ = s.nc.SetReadDeadline(time.Now().Add(systest.EventTimeout))
	defer func() { _ = s.nc.SetReadDeadline(time.Time{}) }()
	for {
		p, _, err := wsutil.ReadServerData(s.rw)
		if err != nil {
			t.Fatalf("sloth: %v", err)
		}
		var m protocol.ServerMessage
		if err := json.Unmarshal(p, &m); err != nil {
			t.Fatalf("sloth: %v", err)
		}
		if match(m) {
			return
		}
	}
}

// stallWithSignals has s and sender join a room, and sender send signals
// there until s's socket stalls: s no longer reads, and signals of
// distinct names, 250 bytes of data each, come to it in room_signal
// frames. The gateway must let sender send them as fast as it can.
func stallWithSignals(t *testing.T, gw *systest.Gateway, s *sloth, sender *client.Conn) {
	t.Helper()
	if err := s.send(map[string]any{"type": "join", "room": "doc:stall"}); err != nil {
		t.Fatal(err)
	}
	s.await(t, func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeRoomState })
	if err := sender.Send(map[string]any{"type": "join", "room": "doc:stall"}); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, sender, systest.EventTimeout, "room_state", func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeRoomState })
	data := map[string]string{"d": strings.Repeat("s", 240)}
	sent := 0
	natstest.CheckFor(t, 60*time.Second, 0, func() error {
		if gw.Stalled("sloth") {
			return nil
		}
		if sent == 200_000 {
			t.Fatalf("%d signals of 250 bytes, and the socket of a member that does not read never stalled", sent)
		}
		for range 100 {
			if err := sender.Send(map[string]any{"type": "signal", "room": "doc:stall", "signal": fmt.Sprintf("s%d", sent), "data": data}); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		return fmt.Errorf("%d signals sent, no socket stalled", sent)
	})
	t.Logf("the sloth's socket stalled after %d signals", sent)

}

// TestSlowPeerHoldsNoReader: a peer that stops reading holds none of the
// gateway's readers. With a single reader, a socket that floods requests
// whose answers it never reads keeps no other socket's frames from being
// read and answered; once more than socket.MaxBacklog waits for it, it is
// closed as too slow, long before the write timeout.
func TestSlowPeerHoldsNoReader(t *testing.T) {
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.StartGateway(gateway.Config{
		Policy:       gateway.PolicyEveryone,
		ReadWorkers:  1,
		WriteTimeout: 5 * time.Minute,
		// The TTL closes no socket here, silent or not: what a peer that
		// does not read holds up shows.
		ConnTTL:   5 * time.Minute,
		RateLimit: 1_000_000,
		RateBurst: 1_000_000,
	})
	other := sys.Dial(gw, "other")
	defer systest.KeepAlive(other, systest.Heartbeat)()
	s := dialSloth(t, gw, "sloth")

	// From now on the sloth never reads. Each subscribe of 100 ids that
	// are not user ids is answered with 100 denied frames, 10 KB: 5,000
	// of them are far more than the socket's buffers and the backlog's
	// bound.
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("x.%030d", i)
	}
	flooded := make(chan error, 1)
	go func() {
		for i := range 5000 {
			if err := s.send(map[string]any{"type": "subscribe", "id": "j", "user_ids": ids}); err != nil {
				flooded <- fmt.Errorf("after %d subscribes: %w", i, err)
				return
			}
		}
		flooded <- nil
	}()
	err := <-flooded
	t.Logf("flood ended: %v", err)

	// The other socket is read and answered at once, and lives on.
	start := time.Now()
	if err := other.Subscribe("after", "sloth"); err != nil {
		t.Fatal(err)
	}
	m := systest.Await(t, other, 5*time.Second, "the answer to a subscribe", func(m protocol.ServerMessage) bool { return m.ID == "after" })
	if m.Type != protocol.TypePresenceInit {
		t.Fatalf("answer %+v, want presence_init", m)
	}
	t.Logf("answered in %v", time.Since(start).Round(time.Millisecond))
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := metricValue(t, gw, "greendot_gateway_slow_socket_closes_total", nil); got != 1 {
			return fmt.Errorf("%v slow socket closes, want 1", got)
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "after") {
		t.Errorf("the flood of a socket closed as too slow ended with %v", err)
	}
	subscribeSelf(t, other, "alive")
}

// TestSlowPeerHoldsNoWriter: a watcher that stops reading holds none of
// the gateway's flush workers. With a single one, a socket whose buffers
// the frames of its room filled keeps no other watcher from seeing a
// change at once; it waits with its changes coalesced (the stalled
// sockets' gauge) until it reads or the write timeout closes it.
func TestSlowPeerHoldsNoWriter(t *testing.T) {
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.StartGateway(gateway.Config{
		Policy:       gateway.PolicyEveryone,
		WriteWorkers: 1,
		WriteTimeout: 5 * time.Minute,
		// The TTL closes no socket here, silent or not: what a peer that
		// does not read holds up shows.
		ConnTTL:     5 * time.Minute,
		RateLimit:   1_000_000,
		RateBurst:   1_000_000,
		SignalRate:  1_000_000,
		SignalBurst: 1_000_000,
	})
	watcher := sys.Dial(gw, "watcher")
	defer systest.KeepAlive(watcher, systest.Heartbeat)()
	target := sys.Dial(gw, "target")
	defer systest.KeepAlive(target, systest.Heartbeat)()
	sender := sys.Dial(gw, "sender")
	defer systest.KeepAlive(sender, systest.Heartbeat)()
	for _, c := range []*client.Conn{watcher} {
		if err := c.Subscribe("w", "target"); err != nil {
			t.Fatal(err)
		}
		systest.Await(t, c, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool { return m.ID == "w" })
	}

	s := dialSloth(t, gw, "sloth")
	if err := s.send(map[string]any{"type": "subscribe", "id": "w", "user_ids": []string{"target"}}); err != nil {
		t.Fatal(err)
	}
	s.await(t, func(m protocol.ServerMessage) bool { return m.ID == "w" })

	stallWithSignals(t, gw, s, sender)

	// A change of the user both watch reaches the other watcher at once.
	start := time.Now()
	if err := target.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, watcher, 5*time.Second, "target busy", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceBatch && len(m.Updates) == 1 && m.Updates[0].Status == "busy"
	})
	t.Logf("the change reached the other watcher in %v", time.Since(start).Round(time.Millisecond))
	if got := metricValue(t, gw, "greendot_gateway_slow_socket_closes_total", nil); got != 0 {
		t.Errorf("%v slow socket closes: the stalled socket waits for the write timeout", got)
	}

	// The sloth reads again: it gets what waited for it, then the change
	// it missed meanwhile.
	s.await(t, func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceBatch && len(m.Updates) == 1 && m.Updates[0].Status == "busy"
	})
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := metricValue(t, gw, "greendot_gateway_stalled_sockets", nil); n != 0 {
			return fmt.Errorf("%v stalled sockets", n)
		}
		return nil
	})
}

// TestStalledSocketClosed: a socket that takes nothing of what waits for
// it for the write timeout is closed as too slow, and its user goes
// offline. (Nothing is added to its backlog once it stalled: its changes
// wait in its box, and it sends nothing to be answered. Only the write
// timeout can close it.)
func TestStalledSocketClosed(t *testing.T) {
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.StartGateway(gateway.Config{
		Policy:       gateway.PolicyEveryone,
		WriteTimeout: 2 * time.Second,
		ConnTTL:      5 * time.Minute,
		RateLimit:    1_000_000,
		RateBurst:    1_000_000,
		SignalRate:   1_000_000,
		SignalBurst:  1_000_000,
	})
	other := sys.Dial(gw, "other")
	defer systest.KeepAlive(other, systest.Heartbeat)()
	sender := sys.Dial(gw, "sender")
	defer systest.KeepAlive(sender, systest.Heartbeat)()
	stallWithSignals(t, gw, dialSloth(t, gw, "sloth"), sender)
	start := time.Now()
	natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if got := metricValue(t, gw, "greendot_gateway_slow_socket_closes_total", nil); got != 1 {
			return fmt.Errorf("%v slow socket closes, want 1", got)
		}
		return nil
	})
	t.Logf("closed %v after it was seen stalled", time.Since(start).Round(time.Millisecond))
	awaitOffline(t, sys, "sloth")
	subscribeSelf(t, other, "alive")
}
