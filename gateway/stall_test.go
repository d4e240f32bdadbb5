//go:build linux

package gateway_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// sloth is a client that stops reading: it reads what it must to set
// itself up, then only writes. Its socket's receive buffer and segments
// are small, set before it connects, so that the gateway's side fills up
// soon (about 130 KB in all, against 1.6 MB with the defaults).
type sloth struct {
	nc     net.Conn
	rw     io.ReadWriter
	connID string
	wmu    sync.Mutex // one message at a time
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
					serr = errors.Join(
						syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096),
						// Small segments keep the gateway's send buffer,
						// which the kernel sizes by them, small too.
						syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 536))
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
	s.await(t, func(m protocol.ServerMessage) bool {
		s.connID = m.ConnID
		return m.Type == protocol.TypeHello
	})
	return s
}

// send writes one message.
func (s *sloth) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
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

// stallSystem starts a system and a gateway of cfg under the everyone
// policy, whose clients may send as fast as they can (rate limits lifted),
// and whose connections live for 5 minutes without a frame unless
// cfg.ConnTTL says otherwise: what a peer that does not read holds up
// shows, and the TTL closes no one.
func stallSystem(t *testing.T, cfg gateway.Config) (*systest.System, *systest.Gateway) {
	t.Helper()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	cfg.Policy = gateway.PolicyEveryone
	cfg.ConnTTL = cmp.Or(cfg.ConnTTL, 5*time.Minute)
	cfg.RateLimit, cfg.RateBurst = 1_000_000, 1_000_000
	cfg.SignalRate, cfg.SignalBurst = 1_000_000, 1_000_000
	return sys, sys.StartGateway(cfg)
}

// stallNames is how many signal names stallWithSignals sends, and the
// pumps after it.
const stallNames = 1000

// stallWithSignals has s and sender join a room, and sender send signals
// there until s's socket stalls: s no longer reads, and signals of
// distinct names, 250 bytes of data each, come to it in room_signal
// frames. The gateway must let sender send them as fast as it can.
//
// The names repeat every stallNames signals: the signals that wait for a
// stalled socket are the newest of each sender's names, so that however
// many are still on their way when it stalls (thousands, on a loaded
// machine), what waits for it stays under the 1 MiB a socket may be
// behind by once it reads again.
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
			if err := sender.Send(map[string]any{"type": "signal", "room": "doc:stall", "signal": fmt.Sprintf("s%d", sent%stallNames), "data": data}); err != nil {
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
// read and answered. Once it stalls it is not read either, so what waits
// for it stays small, whatever it sends; the write timeout closes it.
func TestSlowPeerHoldsNoReader(t *testing.T) {
	t.Parallel()
	sys, gw := stallSystem(t, gateway.Config{
		ReadWorkers:  1,
		WriteTimeout: 6 * time.Second,
	})
	other := sys.Dial(gw, "other")
	defer systest.KeepAlive(other, systest.Heartbeat)()
	s := dialSloth(t, gw, "sloth")

	// From now on the sloth never reads. Each subscribe of 100 ids that
	// are not user ids is answered with 100 denied frames, 10 KB: 5,000
	// of them are far more than the socket's buffers and the backlog's
	// bound. The flood ends when the gateway stops reading the sloth,
	// and the sloth's writes time out.
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
	if err == nil {
		t.Errorf("5,000 subscribes of a socket that does not read were all read")
	}
	// What waits is the rest of the frame that stalled it and the
	// answers to the requests read before (up to MaxQueued wait their
	// turn, 10 KB of answers each): far from the backlog's bound, however
	// long the flood. (The kernel may take a little more for a moment,
	// and the socket be read again until it stalls again.)
	natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if _, ok := gw.PendingUpdates("sloth", s.connID); !ok {
			t.Fatalf("the sloth is gone before its write timeout: what waited for it grew past the backlog's bound")
		}
		if !gw.Stalled("sloth") {
			return errors.New("the sloth's socket is not stalled")
		}
		return nil
	})
	n := gw.Backlog("sloth")
	t.Logf("%d bytes wait for the sloth", n)
	if most := (gateway.MaxQueued + 8) * 10 << 10; n > most {
		t.Errorf("%d bytes wait for the sloth, more than %d: its requests were read while it was stalled", n, most)
	}
	natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if got := metricValue(t, gw, "greendot_gateway_slow_socket_closes_total", nil); got != 1 {
			return fmt.Errorf("%v slow socket closes, want 1", got)
		}
		return nil
	})
	subscribeSelf(t, other, "alive")
}

// TestSlowPeerHoldsNoWriter: a watcher that stops reading holds none of
// the gateway's flush workers. With a single one, a socket whose buffers
// the frames of its room filled keeps no other watcher from seeing a
// change at once; it waits with its changes coalesced (the stalled
// sockets' gauge) until it reads or the write timeout closes it.
func TestSlowPeerHoldsNoWriter(t *testing.T) {
	t.Parallel()
	sys, gw := stallSystem(t, gateway.Config{
		WriteWorkers: 1,
		WriteTimeout: 5 * time.Minute,
	})
	watcher := sys.Dial(gw, "watcher")
	defer systest.KeepAlive(watcher, systest.Heartbeat)()
	target := sys.Dial(gw, "target")
	defer systest.KeepAlive(target, systest.Heartbeat)()
	sender := sys.Dial(gw, "sender")
	defer systest.KeepAlive(sender, systest.Heartbeat)()
	if err := watcher.Subscribe("w", "target"); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, watcher, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool { return m.ID == "w" })

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
	t.Parallel()
	sys, gw := stallSystem(t, gateway.Config{
		WriteTimeout: 2 * time.Second,
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

// TestIntermittentReadersGetEveryFinalState: watchers that read in short
// spells between pauses, while their room's frames keep their sockets
// full and the users they watch keep changing, stall and are written
// again many times over; each still ends with every user's final state,
// and once they read, nothing stays stalled.
func TestIntermittentReadersGetEveryFinalState(t *testing.T) {
	const (
		readers = 6
		targets = 4
		rounds  = 30
	)
	sys, gw := stallSystem(t, gateway.Config{
		WriteTimeout: 5 * time.Minute,
	})
	var names []string
	var users []*client.Conn
	for i := range targets {
		name := fmt.Sprintf("t%d", i)
		c := sys.Dial(gw, name)
		defer systest.KeepAlive(c, systest.Heartbeat)()
		names, users = append(names, name), append(users, c)
	}
	sender := sys.Dial(gw, "sender")
	defer systest.KeepAlive(sender, systest.Heartbeat)()
	if err := sender.Send(map[string]any{"type": "join", "room": "doc:stall"}); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, sender, systest.EventTimeout, "room_state", func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeRoomState })

	views := make([]*slowView, readers)
	for i := range views {
		s := dialSloth(t, gw, fmt.Sprintf("r%d", i))
		if err := s.send(map[string]any{"type": "subscribe", "id": "w", "user_ids": names}); err != nil {
			t.Fatal(err)
		}
		s.await(t, func(m protocol.ServerMessage) bool { return m.ID == "w" })
		if err := s.send(map[string]any{"type": "join", "room": "doc:stall"}); err != nil {
			t.Fatal(err)
		}
		s.await(t, func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeRoomState })
		views[i] = readInSpells(t, s, time.Duration(100+30*i)*time.Millisecond)
	}

	start := time.Now()
	// Signals fill the readers' sockets while the targets change.
	data := map[string]string{"d": strings.Repeat("s", 240)}
	statuses := []string{"away", "busy", "online"}
	tick := time.NewTicker(100 * time.Millisecond) // the load's pace
	defer tick.Stop()
	// At least rounds rounds, and on until the readers' sockets stalled
	// twice each on average (a loaded machine reads them faster than it
	// fills them for a while), at most ten times as many.
	stalled := func() bool { return metricValue(t, gw, "greendot_gateway_socket_stalls_total", nil) >= 2*readers }
	for round := 0; round < rounds || !stalled() && round < 10*rounds; round++ {
		<-tick.C
		for i := range 500 {
			if err := sender.Send(map[string]any{"type": "signal", "room": "doc:stall", "signal": fmt.Sprintf("s%d", i), "data": data}); err != nil {
				t.Fatal(err)
			}
		}
		for i, c := range users {
			if err := c.SetStatus(statuses[(round+i)%len(statuses)]); err != nil {
				t.Fatal(err)
			}
		}
	}
	final := map[string]string{}
	for i, c := range users {
		st := []string{"busy", "away"}[i%2]
		if err := c.SetStatus(st); err != nil {
			t.Fatal(err)
		}
		final[names[i]] = st
	}
	stalls := metricValue(t, gw, "greendot_gateway_socket_stalls_total", nil)
	t.Logf("%v stalls in %v", stalls, time.Since(start).Round(time.Millisecond))
	// A machine loaded by other tests may fill the sockets slower than the
	// loop above hopes for: one stall per reader on average still has the
	// readers' final states cross stalled sockets.
	if stalls < readers {
		t.Errorf("%v stalls of %d readers' sockets: the test did not stall them", stalls, readers)
	}
	for i, v := range views {
		v.await(t, 60*time.Second, final, fmt.Sprintf("reader %d", i))
	}
	t.Logf("every reader has every final state after %v", time.Since(start).Round(time.Millisecond))
	natstest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := metricValue(t, gw, "greendot_gateway_stalled_sockets", nil); n != 0 {
			return fmt.Errorf("%v sockets still stalled", n)
		}
		return nil
	})
	if got := metricValue(t, gw, "greendot_gateway_slow_socket_closes_total", nil); got != 0 {
		t.Errorf("%v slow socket closes", got)
	}
}

// slowView is what a client reading in spells has seen of the users it
// watches: the newest status of each.
type slowView struct {
	mu     sync.Mutex
	status map[string]string
	err    error
	seen   chan struct{} // a change, or the end
}

// readInSpells reads s's socket for 20 ms at a time, pause apart, until
// the test ends, and keeps the statuses its frames carry.
func readInSpells(t *testing.T, s *sloth, pause time.Duration) *slowView {
	v := &slowView{status: map[string]string{}, seen: make(chan struct{}, 1)}
	pr, pw := io.Pipe()
	done := make(chan struct{})
	t.Cleanup(func() {
		close(done)
		_ = s.nc.Close()
		_ = pr.Close()
	})
	go func() { // the socket, in spells, into the pipe
		buf := make([]byte, 16<<10)
		for {
			select {
			case <-done:
				return
			case <-time.After(pause): // the client is busy: the socket fills
			}
			_ = s.nc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			for {
				n, err := s.rw.Read(buf)
				if n > 0 {
					if _, werr := pw.Write(buf[:n]); werr != nil {
						return
					}
				}
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					break
				}
				if err != nil {
					pw.CloseWithError(err)
					return
				}
			}
		}
	}()
	go func() { // the frames, from the pipe
		rw := struct {
			io.Reader
			io.Writer
		}{bufio.NewReader(pr), io.Discard}
		for {
			p, _, err := wsutil.ReadServerData(rw)
			if err == nil && !bytes.HasPrefix(p, []byte(`{"type":"room_signal"`)) {
				var m protocol.ServerMessage
				err = json.Unmarshal(p, &m)
				v.mu.Lock()
				for _, u := range m.Updates {
					v.status[u.UserID] = string(u.Status)
				}
				v.mu.Unlock()
			}
			if err != nil {
				v.mu.Lock()
				v.err = err
				v.mu.Unlock()
			}
			select {
			case v.seen <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	return v
}

// await waits until v has seen want of every user.
func (v *slowView) await(t *testing.T, timeout time.Duration, want map[string]string, who string) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		v.mu.Lock()
		missing := ""
		for u, st := range want {
			if v.status[u] != st {
				missing += fmt.Sprintf(" %s %q (want %q)", u, v.status[u], st)
			}
		}
		err := v.err
		v.mu.Unlock()
		if missing == "" {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v; has%s", who, err, missing)
		}
		select {
		case <-v.seen:
		case <-deadline.C:
			t.Fatalf("%s after %v: has%s", who, timeout, missing)
		}
	}
}

// TestStalledPeerIsNotDead: a stalled socket is not read, so its peer's
// heartbeats wait unread; the TTL does not end it meanwhile (the write
// timeout judges it), and once its peer reads again it is read again and
// lives on.
func TestStalledPeerIsNotDead(t *testing.T) {
	t.Parallel()
	sys, gw := stallSystem(t, gateway.Config{
		ConnTTL:      systest.TTL,
		WriteTimeout: time.Minute,
	})
	sender := sys.Dial(gw, "sender")
	defer systest.KeepAlive(sender, systest.Heartbeat)()
	s := dialSloth(t, gw, "sloth")
	beats := make(chan struct{})
	beating := make(chan error, 1)
	go func() { // the sloth's heartbeats, which it sends whether it reads or not
		tick := time.NewTicker(systest.Heartbeat)
		defer tick.Stop()
		for {
			select {
			case <-beats:
				beating <- nil
				return
			case <-tick.C:
			}
			if err := s.send(map[string]any{"type": "heartbeat"}); err != nil {
				beating <- err
				return
			}
		}
	}()
	defer func() {
		close(beats)
		if err := <-beating; err != nil {
			t.Errorf("the sloth's heartbeats: %v", err)
		}
	}()
	stallWithSignals(t, gw, s, sender)

	// More signals keep its socket full until the gateway has read
	// nothing of it for two TTLs, its heartbeats waiting unread.
	data := map[string]string{"d": strings.Repeat("s", 240)}
	pumped := make(chan error, 1)
	stopPump := make(chan struct{})
	go func() {
		tick := time.NewTicker(10 * time.Millisecond) // the load's pace
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopPump:
				pumped <- nil
				return
			case <-tick.C:
			}
			if err := sender.Send(map[string]any{"type": "signal", "room": "doc:stall", "signal": fmt.Sprintf("p%d", i%stallNames), "data": data}); err != nil {
				pumped <- err
				return
			}
		}
	}()
	natstest.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		if _, ok := gw.PendingUpdates("sloth", s.connID); !ok {
			t.Fatalf("the sloth's connection ended while it did not read")
		}
		if unread := time.Since(gw.LastFrame("sloth")); unread < 2*systest.TTL {
			return fmt.Errorf("the sloth was read %v ago", unread)
		}
		return nil
	})
	close(stopPump)
	if err := <-pumped; err != nil {
		t.Fatal(err)
	}

	// The sloth reads again, everything, and lives on for three TTLs more.
	read := make(chan error, 1)
	go func() {
		for {
			if _, _, err := wsutil.ReadServerData(s.rw); err != nil {
				read <- err
				return
			}
		}
	}()
	start := time.Now()
	natstest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		select {
		case err := <-read:
			t.Fatalf("the sloth, reading again: %v", err)
		default:
		}
		if _, ok := gw.PendingUpdates("sloth", s.connID); !ok {
			t.Fatalf("the sloth's connection ended %v after it read again", time.Since(start))
		}
		if gw.Stalled("sloth") || time.Since(start) < 3*systest.TTL {
			return errors.New("reading")
		}
		return nil
	})
	if got := metricValue(t, gw, "greendot_gateway_connections_closed_total", nil); got != 0 {
		t.Errorf("%v connections closed", got)
	}
}
