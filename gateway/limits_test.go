package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// handFrame builds one client frame by hand, so that it can break the
// rules a WebSocket library enforces: fin, the three reserved bits, any
// op code (4 bits), masked or not, and a payload length field that may lie
// (length < 0 means the real length).
func handFrame(fin bool, rsv, op byte, masked bool, length int64, payload []byte) []byte {
	var b bytes.Buffer
	b0 := rsv<<4 | op&0x0f
	if fin {
		b0 |= 0x80
	}
	b.WriteByte(b0)
	if length < 0 {
		length = int64(len(payload))
	}
	var m byte
	if masked {
		m = 0x80
	}
	switch {
	case length < 126:
		b.WriteByte(m | byte(length))
	case length <= 0xffff:
		b.WriteByte(m | 126)
		_ = binary.Write(&b, binary.BigEndian, uint16(length))
	default:
		b.WriteByte(m | 127)
		_ = binary.Write(&b, binary.BigEndian, uint64(length))
	}
	p := bytes.Clone(payload)
	if masked {
		key := [4]byte{0x37, 0xfa, 0x21, 0x3d}
		b.Write(key[:])
		for i := range p {
			p[i] ^= key[i%4]
		}
	}
	b.Write(p)
	return b.Bytes()
}

// text is a masked, final text frame: what a well-behaved client sends.
func text(payload string) []byte {
	return handFrame(true, 0, byte(ws.OpText), true, -1, []byte(payload))
}

// closePayload is the payload of a close frame.
func closePayload(code uint16, reason string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, code), reason...)
}

// metricValue returns the value of a counter or gauge of g, or how many
// values a histogram observed, with the given labels (a sum over series
// when labels is nil).
func metricValue(tb testing.TB, g *systest.Gateway, name string, labels map[string]string) float64 {
	tb.Helper()
	families, err := g.Registry().Gather()
	if err != nil {
		tb.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if gg := m.GetGauge(); gg != nil {
				sum += gg.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				sum += float64(h.GetSampleCount())
			}
		}
	}
	return sum
}

// awaitOffline waits until user has no connection left in their status
// record: nothing a socket did left it online.
func awaitOffline(tb testing.TB, sys *systest.System, user string) {
	tb.Helper()
	natstest.CheckFor(tb, 10*time.Second, 20*time.Millisecond, func() error {
		rec, err := sys.StatusOf(user)
		if err != nil {
			return err
		}
		if rec.Status != presence.Offline || len(rec.Conns) != 0 {
			return fmt.Errorf("%s: %+v, want offline with no connection", user, rec)
		}
		return nil
	})
}

func TestFrameViolationsClose(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	big := strings.Repeat("x", gateway.DefaultMaxMessageSize+1)
	half := []byte(strings.Repeat("y", gateway.DefaultMaxMessageSize/2+1))
	tests := []struct {
		name   string
		frames [][]byte
		code   ws.StatusCode
	}{
		{"binary frame", [][]byte{handFrame(true, 0, byte(ws.OpBinary), true, -1, []byte(`{"type":"heartbeat"}`))}, ws.StatusUnsupportedData},
		{"fragmented binary", [][]byte{handFrame(false, 0, byte(ws.OpBinary), true, -1, []byte("ab"))}, ws.StatusUnsupportedData},
		{"frame over the size limit", [][]byte{text(big)}, ws.StatusMessageTooBig},
		{"length field over the limit", [][]byte{handFrame(true, 0, byte(ws.OpText), true, 1<<40, nil)}, ws.StatusMessageTooBig},
		{"fragments over the size limit", [][]byte{
			handFrame(false, 0, byte(ws.OpText), true, -1, half),
			handFrame(true, 0, byte(ws.OpContinuation), true, -1, half),
		}, ws.StatusMessageTooBig},
		{"unmasked frame", [][]byte{handFrame(true, 0, byte(ws.OpText), false, -1, []byte(`{"type":"heartbeat"}`))}, ws.StatusProtocolError},
		{"reserved data op code", [][]byte{handFrame(true, 0, 0x3, true, -1, []byte("x"))}, ws.StatusProtocolError},
		{"reserved control op code", [][]byte{handFrame(true, 0, 0xb, true, -1, []byte("x"))}, ws.StatusProtocolError},
		{"reserved bit", [][]byte{handFrame(true, 4, byte(ws.OpText), true, -1, []byte(`{"type":"heartbeat"}`))}, ws.StatusProtocolError},
		{"fragmented ping", [][]byte{handFrame(false, 0, byte(ws.OpPing), true, -1, []byte("x"))}, ws.StatusProtocolError},
		{"ping over 125 bytes", [][]byte{handFrame(true, 0, byte(ws.OpPing), true, -1, bytes.Repeat([]byte("p"), 126))}, ws.StatusProtocolError},
		{"length with the top bit set", [][]byte{{0x81, 0x80 | 127, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4}}, ws.StatusProtocolError},
		{"continuation with nothing to continue", [][]byte{handFrame(true, 0, byte(ws.OpContinuation), true, -1, []byte("x"))}, ws.StatusProtocolError},
		{"new message inside a fragmented one", [][]byte{
			handFrame(false, 0, byte(ws.OpText), true, -1, []byte(`{"type":`)),
			text(`{"type":"heartbeat"}`),
		}, ws.StatusProtocolError},
		{"ping inside a fragmented message at the size limit", [][]byte{
			// 4090 bytes of message and a 36-byte ping frame: over
			// 4096 + 14.
			handFrame(false, 0, byte(ws.OpText), true, -1, bytes.Repeat([]byte("f"), gateway.DefaultMaxMessageSize-6)),
			handFrame(true, 0, byte(ws.OpPing), true, -1, bytes.Repeat([]byte("p"), 30)),
		}, ws.StatusMessageTooBig},
		{"invalid UTF-8", [][]byte{text("{\"type\":\"\xff\xfe\"}")}, ws.StatusInvalidFramePayloadData},
		{"UTF-8 split over fragments, then cut", [][]byte{
			handFrame(false, 0, byte(ws.OpText), true, -1, []byte("{\"type\":\"\xe2\x82")),
			handFrame(true, 0, byte(ws.OpContinuation), true, -1, []byte("\"}")),
		}, ws.StatusInvalidFramePayloadData},
		{"close with a one-byte payload", [][]byte{handFrame(true, 0, byte(ws.OpClose), true, -1, []byte{3})}, ws.StatusProtocolError},
		{"close code not in use (999)", [][]byte{handFrame(true, 0, byte(ws.OpClose), true, -1, closePayload(999, ""))}, ws.StatusProtocolError},
		{"close code reserved (1005)", [][]byte{handFrame(true, 0, byte(ws.OpClose), true, -1, closePayload(1005, ""))}, ws.StatusProtocolError},
		{"close code undefined (1016)", [][]byte{handFrame(true, 0, byte(ws.OpClose), true, -1, closePayload(1016, ""))}, ws.StatusProtocolError},
		{"close code out of range (5000)", [][]byte{handFrame(true, 0, byte(ws.OpClose), true, -1, closePayload(5000, ""))}, ws.StatusProtocolError},
		{"close reason not UTF-8", [][]byte{handFrame(true, 0, byte(ws.OpClose), true, -1, closePayload(1000, "\xff"))}, ws.StatusProtocolError},
		// The well-formed closes, for contrast: echoed.
		{"empty close", [][]byte{handFrame(true, 0, byte(ws.OpClose), true, -1, nil)}, ws.StatusNormalClosure},
		{"close 1001", [][]byte{handFrame(true, 0, byte(ws.OpClose), true, -1, closePayload(1001, "bye"))}, ws.StatusGoingAway},
		{"close 4000", [][]byte{handFrame(true, 0, byte(ws.OpClose), true, -1, closePayload(4000, "app"))}, 4000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := secDial(t, gw, "mallory")
			// One write, so that the gateway reads every byte before it
			// closes (unread bytes would turn its close into a reset).
			if err := c.WriteBytes(bytes.Join(tt.frames, nil)); err != nil {
				t.Fatal(err)
			}
			code, seen := awaitClose(t, c, systest.EventTimeout)
			if code != tt.code {
				t.Errorf("closed with %d, want %d (frames before: %+v)", code, tt.code, seen)
			}
			by.check(t)
		})
	}
	// Every hostile socket is gone, and so is mallory.
	awaitOffline(t, sys, "mallory")
	if n := gw.Conns(); n != 2 {
		t.Errorf("gateway holds %d connections, want the 2 bystanders", n)
	}
}

func TestValidFramingAccepted(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	c := secDial(t, gw, "alice")
	// A fragmented message with a ping between its fragments, a message
	// of exactly the size limit, a frame with a needlessly long length
	// field: all fine.
	sub := `{"type":"subscribe","id":"frag","user_ids":["alice"]}`
	exact := `{"type":"heartbeat","pad":"` + strings.Repeat("z", gateway.DefaultMaxMessageSize-len(`{"type":"heartbeat","pad":""}`)) + `"}`
	long := []byte(`{"type":"subscribe","id":"long","user_ids":["alice"]}`)
	frames := [][]byte{
		handFrame(false, 0, byte(ws.OpText), true, -1, []byte(sub[:10])),
		handFrame(true, 0, byte(ws.OpPing), true, -1, []byte("ping")),
		handFrame(false, 0, byte(ws.OpContinuation), true, -1, []byte(sub[10:20])),
		handFrame(true, 0, byte(ws.OpContinuation), true, -1, []byte(sub[20:])),
		text(exact),
	}
	if err := c.WriteBytes(bytes.Join(frames, nil)); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, c, systest.EventTimeout, "presence_init frag", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "frag"
	})
	// 64-bit length field for a short payload, written a byte at a time.
	lf := handFrame(true, 0, byte(ws.OpText), true, -1, long)
	var lb bytes.Buffer
	lb.WriteByte(lf[0])
	lb.WriteByte(0x80 | 127)
	_ = binary.Write(&lb, binary.BigEndian, uint64(len(long)))
	lb.Write(lf[2:])
	for _, b := range lb.Bytes() {
		if err := c.WriteBytes([]byte{b}); err != nil {
			t.Fatal(err)
		}
	}
	systest.Await(t, c, systest.EventTimeout, "presence_init long", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "long"
	})
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	cfg := gw.Config()
	hb := text(`{"type":"heartbeat"}`)

	t.Run("burst", func(t *testing.T) {
		// A burst a little over the bucket: a few rate_limited errors, and
		// the socket stays open.
		c := secDial(t, gw, "mallory")
		over := 5
		if err := c.WriteBytes(bytes.Repeat(hb, cfg.RateBurst+over)); err != nil {
			t.Fatal(err)
		}
		limited := 0
		for _, m := range stillOpen(t, c, time.Now().Add(time.Second)) {
			if m.Type == protocol.TypeError {
				if m.Code != protocol.CodeRateLimited || m.Message == "" {
					t.Errorf("error %+v, want rate_limited", m)
				}
				limited++
			}
		}
		if limited < 1 || limited > over {
			t.Errorf("%d rate_limited errors for %d messages over the burst", limited, over)
		}
		subscribeSelf(t, c, "after-burst")
		by.check(t)
	})

	t.Run("sustained", func(t *testing.T) {
		// Far over the bucket: RateStrikes errors, then close 1008.
		c := secDial(t, gw, "mallory")
		n := cfg.RateBurst + cfg.RateStrikes + 5
		if err := c.WriteBytes(bytes.Repeat(hb, n)); err != nil {
			t.Fatal(err)
		}
		code, seen := awaitClose(t, c, systest.EventTimeout)
		if code != protocol.ClosePolicy {
			t.Errorf("closed with %d, want %d", code, protocol.ClosePolicy)
		}
		limited := 0
		for _, m := range seen {
			if m.Type == protocol.TypeError && m.Code == protocol.CodeRateLimited {
				limited++
			}
		}
		if limited != cfg.RateStrikes {
			t.Errorf("%d rate_limited errors before the close, want %d", limited, cfg.RateStrikes)
		}
		by.check(t)
	})

	t.Run("pings count too", func(t *testing.T) {
		c := secDial(t, gw, "mallory")
		ping := handFrame(true, 0, byte(ws.OpPing), true, -1, []byte("p"))
		n := cfg.RateBurst + cfg.RateStrikes + 5
		if err := c.WriteBytes(bytes.Repeat(ping, n)); err != nil {
			t.Fatal(err)
		}
		if code, _ := awaitClose(t, c, systest.EventTimeout); code != protocol.ClosePolicy {
			t.Errorf("closed with %d, want %d", code, protocol.ClosePolicy)
		}
		by.check(t)
	})

	// Every frame counts, not only messages and pings: unsolicited pongs
	// (masked and empty, the cheapest frame there is), empty fragments of
	// a message that never ends, pongs between the fragments of one.
	n := cfg.RateBurst + cfg.RateStrikes + 5
	pong := handFrame(true, 0, byte(ws.OpPong), true, -1, nil)
	open := handFrame(false, 0, byte(ws.OpText), true, -1, []byte(`{"type":`))
	empty := handFrame(false, 0, byte(ws.OpContinuation), true, -1, nil)
	for _, tt := range []struct {
		name   string
		frames []byte
	}{
		{"pongs count too", bytes.Repeat(pong, n)},
		{"fragments count too", append(bytes.Clone(open), bytes.Repeat(empty, n)...)},
		{"pongs between fragments count too", append(bytes.Clone(open), bytes.Repeat(pong, n)...)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := secDial(t, gw, "mallory")
			if err := c.WriteBytes(tt.frames); err != nil {
				t.Fatal(err)
			}
			code, seen := awaitClose(t, c, systest.EventTimeout)
			if code != protocol.ClosePolicy {
				t.Errorf("closed with %d, want %d", code, protocol.ClosePolicy)
			}
			limited := 0
			for _, m := range seen {
				if m.Type == protocol.TypeError && m.Code == protocol.CodeRateLimited {
					limited++
				}
			}
			if limited != cfg.RateStrikes {
				t.Errorf("%d rate_limited errors before the close, want %d", limited, cfg.RateStrikes)
			}
			by.check(t)
		})
	}
	awaitOffline(t, sys, "mallory")
}

// TestRoomLimitsEarnNoStrikes: the rate_limited errors of the room_update
// and signal limits are not strikes of --rate-strikes: far more of them
// than the strikes allowed leave the socket open.
func TestRoomLimitsEarnNoStrikes(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{
		RateStrikes: 2, RoomUpdateRate: 0.01, RoomUpdateBurst: 1, SignalRate: 0.01, SignalBurst: 1,
	}})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	c, err := secDialErr(gw.WS, bearer(roomToken(t, "mallory", []string{"doc:*"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Abort() })
	joinRoom(t, c, "j", "doc:1", "")
	limited := 0
	for i := range 6 {
		sendRoom(t, c, protocol.TypeRoomUpdate, fmt.Sprint("u", i), "doc:1", `{}`)
		sendRoom(t, c, protocol.TypeTyping, fmt.Sprint("t", i), "doc:1", "")
		if i == 0 {
			continue // the bursts of 1
		}
		for _, id := range []string{fmt.Sprint("u", i), fmt.Sprint("t", i)} {
			m := systest.Await(t, c, systest.EventTimeout, "the refusal of "+id, func(m protocol.ServerMessage) bool {
				return m.Type == protocol.TypeError && m.ID == id
			})
			if m.Code != protocol.CodeRateLimited {
				t.Fatalf("%s: %+v, want rate_limited", id, m)
			}
			limited++
		}
	}
	if limited <= gw.Config().RateStrikes {
		t.Fatalf("%d refusals, want more than the %d strikes", limited, gw.Config().RateStrikes)
	}
	subscribeSelf(t, c, "after")
	by.check(t)
}

// TestRefusedFrameDropsItsMessage: a message one of whose fragments was
// refused by the rate limit is dropped, even when its last frame comes
// once the socket may send again: the refusal's rate_limited error is its
// only answer.
func TestRefusedFrameDropsItsMessage(t *testing.T) {
	t.Parallel()
	// One frame at once, then one every 50 ms; a TTL that outlasts the
	// waits for the bucket to refill.
	const rate = 20
	sys := secStart(t, systest.Options{Gateway: gateway.Config{RateLimit: rate, RateBurst: 1, ConnTTL: 30 * time.Second}})
	gw := sys.Gateway()
	c := secDial(t, gw, "alice")
	answer := func(what string) protocol.ServerMessage {
		return systest.Await(t, c, systest.EventTimeout, what, func(m protocol.ServerMessage) bool {
			return m.Type == protocol.TypeError || m.Type == protocol.TypePresenceInit
		})
	}
	sub := `{"type":"subscribe","id":"dropped","user_ids":["alice"]}`
	// The first fragment takes the one token, the second finds none.
	first := handFrame(false, 0, byte(ws.OpText), true, -1, []byte(sub[:10]))
	second := handFrame(false, 0, byte(ws.OpContinuation), true, -1, []byte(sub[10:20]))
	if err := c.WriteBytes(append(first, second...)); err != nil {
		t.Fatal(err)
	}
	if m := answer("rate_limited"); m.Type != protocol.TypeError || m.Code != protocol.CodeRateLimited {
		t.Fatalf("after a fragment over the limit: %+v, want error rate_limited", m)
	}
	// The time under test: the bucket holds a token again after 50 ms,
	// surely after ten times that. Then the last frame is taken, and
	// after another wait a subscribe, whose answer must be the next.
	refill := func() { time.Sleep(10 * time.Second / rate) }
	refill()
	if err := c.WriteBytes(handFrame(true, 0, byte(ws.OpContinuation), true, -1, []byte(sub[20:]))); err != nil {
		t.Fatal(err)
	}
	refill()
	if err := c.Subscribe("after", "alice"); err != nil {
		t.Fatal(err)
	}
	if m := answer("presence_init after"); m.Type != protocol.TypePresenceInit || m.ID != "after" {
		t.Errorf("next answer %+v, want presence_init after: the message of the refused fragment was served", m)
	}
}

// TestUnfinishedMessageIsCut: frames between the fragments of a message
// that never ends are no sign of life, however slowly they come: the
// socket is closed at the connection TTL, as a silent one is.
func TestUnfinishedMessageIsCut(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	by := newBystander(t, sys, sys.Gateway())
	c := secDial(t, sys.Gateway(), "slowpoke")
	if err := c.WriteBytes(handFrame(false, 0, byte(ws.OpText), true, -1, []byte(`{"type":`))); err != nil {
		t.Fatal(err)
	}
	// A pong every heartbeat interval, well within the rate limit, for
	// far longer than the TTL.
	start := time.Now()
	pongs := strings.Repeat(string(handFrame(true, 0, byte(ws.OpPong), true, -1, nil)), 30)
	go trickleFrames(c.NetConn(), pongs, len(handFrame(true, 0, byte(ws.OpPong), true, -1, nil)), systest.Heartbeat)
	_, took := readUntilCut(t, c.NetConn(), start, systest.TTL+5*time.Second)
	if took > systest.TTL+2*time.Second {
		t.Errorf("cut after %v, want within the TTL (%v) and the sweep", took, systest.TTL)
	}
	awaitOffline(t, sys, "slowpoke")
	by.check(t)
}

// streamWrites returns how many messages the streams of buckets have
// taken in all: their JetStream writes.
func streamWrites(tb testing.TB, sys *systest.System, buckets ...string) uint64 {
	tb.Helper()
	ctx := context.Background()
	var n uint64
	for _, b := range buckets {
		st, err := sys.Store.JetStream().Stream(ctx, presence.StreamName(b))
		if err != nil {
			tb.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		n += info.State.LastSeq
	}
	return n
}

// TestIdleConnectionsWriteNothing pins the rule of the hot path: NATS
// traffic is proportional to presence changes, never to time or to the
// number of idle connections. Sockets that only heartbeat cost no
// JetStream write at all: over a few TTLs, one socket and fifty make no
// write but the gateway's lease refreshes, which come on the lease's
// clock (a quarter of its TTL, here the connection TTL), whatever the
// sockets do.
func TestIdleConnectionsWriteNothing(t *testing.T) {
	t.Parallel()
	const (
		period = 4 * time.Second // four TTLs
		every  = systest.TTL / 4 // the lease's refresh period
	)
	writes := func(t *testing.T, n int) {
		sys := secStart(t, systest.Options{NoFanout: true})
		gw := sys.Gateway()
		var socks []*client.Conn
		for i := range n {
			c := secDial(t, gw, fmt.Sprintf("idle%02d", i))
			defer systest.KeepAlive(c, systest.Heartbeat)()
			socks = append(socks, c)
		}
		// The lease's writes are counted apart from the others: the
		// refresh counter moves only once a refresh's write is acknowledged,
		// a moment after the stream has taken it.
		others := []string{presence.ConnsBucket, presence.StatusBucket, presence.GraphBucket}
		before := streamWrites(t, sys, others...)
		leaseBefore := streamWrites(t, sys, presence.LeasesBucket)
		refreshes := metricValue(t, gw, "greendot_gateway_lease_refreshes_total", nil)
		start := time.Now()
		natstest.CheckFor(t, 2*period, 50*time.Millisecond, func() error {
			if time.Since(start) < period {
				return errors.New("still heartbeating")
			}
			return nil
		})
		w := streamWrites(t, sys, others...) - before
		var lease, leaseWrites uint64
		natstest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			leaseWrites = streamWrites(t, sys, presence.LeasesBucket) - leaseBefore
			lease = uint64(metricValue(t, gw, "greendot_gateway_lease_refreshes_total", nil) - refreshes)
			if leaseWrites > lease {
				return fmt.Errorf("%d writes of the lease, %d of them refreshes", leaseWrites, lease)
			}
			return nil
		})
		w += leaseWrites
		elapsed := time.Since(start)
		t.Logf("%d sockets heartbeating for %v: %d JetStream writes, %d of them lease refreshes", n, elapsed.Round(time.Millisecond), w, lease)
		if w > lease {
			t.Errorf("%d JetStream writes besides the %d lease refreshes while %d sockets only heartbeat", w-lease, lease, n)
		}
		// A clock never ticks faster than its period (a loaded machine
		// makes it tick less often): more refreshes than that would be
		// writes that grow with something else.
		if most := uint64(elapsed/every) + 2; lease > most {
			t.Errorf("%d lease refreshes in %v, more than one per %v (%d)", lease, elapsed.Round(time.Millisecond), every, most)
		}
		for _, c := range socks {
			subscribeSelf(t, c, "alive")
		}
	}
	writes(t, 1)
	writes(t, 50)
}

func TestSubscriptionLimits(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}})
	gw := sys.Gateway()
	by := newBystander(t, sys, gw)
	c := secDial(t, gw, "mallory")
	defer systest.KeepAlive(c, systest.Heartbeat)()
	ids := func(from, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("u%d", from+i)
		}
		return out
	}

	// More than 100 ids in one subscribe: an error, nothing subscribed.
	if err := c.Subscribe("big", ids(0, gateway.DefaultMaxSubscribeIDs+1)...); err != nil {
		t.Fatal(err)
	}
	m := systest.Await(t, c, systest.EventTimeout, "answer to big", func(m protocol.ServerMessage) bool { return m.ID == "big" })
	if m.Type != protocol.TypeError || m.Code != protocol.CodeBadRequest {
		t.Errorf("subscribe with %d ids: %+v, want error bad_request", gateway.DefaultMaxSubscribeIDs+1, m)
	}

	// 500 subscriptions in five subscribes of 100: all allowed.
	for i := range gateway.DefaultMaxSubscriptions / gateway.DefaultMaxSubscribeIDs {
		id := fmt.Sprintf("s%d", i)
		if err := c.Subscribe(id, ids(i*100, 100)...); err != nil {
			t.Fatal(err)
		}
		m := systest.Await(t, c, systest.EventTimeout, "answer to "+id, func(m protocol.ServerMessage) bool { return m.ID == id })
		if m.Type != protocol.TypePresenceInit || len(m.Users) != 100 {
			t.Fatalf("subscribe %s: %s with %d users, want presence_init with 100", id, m.Type, len(m.Users))
		}
	}
	// The 501st is denied; one already watched is still answered.
	if err := c.Subscribe("more", "u0", "u500"); err != nil {
		t.Fatal(err)
	}
	m = systest.Await(t, c, systest.EventTimeout, "presence_init more", func(m protocol.ServerMessage) bool { return m.ID == "more" })
	if m.Type != protocol.TypePresenceInit || len(m.Users) != 1 || m.Users[0].UserID != "u0" {
		t.Errorf("presence_init = %+v, want u0 only", m)
	}
	d := systest.Await(t, c, systest.EventTimeout, "denied u500", func(m protocol.ServerMessage) bool { return m.ID == "more" })
	if d.Type != protocol.TypeDenied || d.UserID != "u500" || d.Reason != protocol.ReasonTooManySubscriptions {
		t.Errorf("denied = %+v, want u500 too_many_subscriptions", d)
	}
	// Room again after an unsubscribe.
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, UserIDs: []string{"u1"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Subscribe("room", "u500"); err != nil {
		t.Fatal(err)
	}
	m = systest.Await(t, c, systest.EventTimeout, "presence_init room", func(m protocol.ServerMessage) bool { return m.ID == "room" })
	if m.Type != protocol.TypePresenceInit || len(m.Users) != 1 {
		t.Errorf("after an unsubscribe: %+v, want presence_init of u500", m)
	}
	if metricValue(t, gw, "greendot_gateway_watched_users", nil) < 500 {
		t.Errorf("watched users gauge below 500")
	}
	by.check(t)

	// The HTTP query: 500 ids answered, 501 refused with 400, a body over
	// 64 KiB with 413.
	h := bearer(secLongToken(t, "mallory"))
	var q queryAnswer
	if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", h, map[string]any{"user_ids": ids(0, gateway.DefaultMaxQueryIDs)}, &q); st != http.StatusOK || len(q.Users) != gateway.DefaultMaxQueryIDs {
		t.Errorf("query of %d ids: %d with %d users", gateway.DefaultMaxQueryIDs, st, len(q.Users))
	}
	var e apiErr
	if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", h, map[string]any{"user_ids": ids(0, gateway.DefaultMaxQueryIDs+1)}, &e); st != http.StatusBadRequest || e.Error != "bad_request" {
		t.Errorf("query of %d ids: %d %+v, want 400 bad_request", gateway.DefaultMaxQueryIDs+1, st, e)
	}
	if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", h, map[string]any{"user_ids": []string{strings.Repeat("a", 70<<10)}}, &e); st != http.StatusRequestEntityTooLarge {
		t.Errorf("query body over 64 KiB: %d %+v, want 413", st, e)
	}
	by.check(t)
}

// trickle writes data to nc a byte at a time, every interval, until it is
// all written or a write fails.
func trickle(nc net.Conn, data string, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for i := range len(data) {
		<-t.C
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := nc.Write([]byte{data[i]}); err != nil {
			return
		}
	}
}

// trickleFrames writes data to nc size bytes at a time, every interval,
// until it is all written or a write fails.
func trickleFrames(nc net.Conn, data string, size int, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for i := 0; i < len(data); i += size {
		<-t.C
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := nc.Write([]byte(data[i:min(i+size, len(data))])); err != nil {
			return
		}
	}
}

func TestSlowHandshakeIsCut(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	sys := secStart(t, systest.Options{})
	by := newBystander(t, sys, sys.Gateway())
	gw := sys.StartGateway(gateway.Config{HandshakeTimeout: timeout})
	tok := secLongToken(t, "slowpoke")
	tests := []struct {
		name, data string
	}{
		{"first bytes", "GET /w"},
		{"upgrade headers", "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer " + tok + "\r\n\r\n"},
		{"HTTP API headers", "GET /api/presence/users/slowpoke HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok + "\r\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", gw.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			start := time.Now()
			// A byte every 100ms: the whole request would take far longer
			// than the handshake timeout.
			go trickle(nc, tt.data, 100*time.Millisecond)
			got, took := readUntilCut(t, nc, start, timeout+5*time.Second)
			if bytes.HasPrefix(got, []byte("HTTP/1.1 101")) || bytes.HasPrefix(got, []byte("HTTP/1.1 200")) {
				t.Fatalf("slow request was served: %q", got)
			}
			if took < timeout-100*time.Millisecond || took > timeout+2*time.Second {
				t.Errorf("cut after %v, want about %v", took, timeout)
			}
		})
	}
	if n := gw.Conns(); n != 0 {
		t.Errorf("gateway holds %d connections", n)
	}
	rec, err := sys.StatusOf("slowpoke")
	if err != nil || len(rec.Conns) != 0 {
		t.Errorf("slowpoke registered: %+v %v", rec, err)
	}
	by.check(t)
}

// TestAPIHeadIsBounded: an HTTP request has an upgrade's bounds. The first
// request of a connection must be read within the handshake timeout of
// the accept, however long the gateway took to tell it from an upgrade;
// its head holds at most 32 KiB; a connection kept alive is closed once
// idle for the handshake timeout.
func TestAPIHeadIsBounded(t *testing.T) {
	t.Parallel()
	const timeout = 3 * time.Second
	sys := secStart(t, systest.Options{})
	by := newBystander(t, sys, sys.Gateway())
	gw := sys.StartGateway(gateway.Config{HandshakeTimeout: timeout})
	auth := "Authorization: Bearer " + secLongToken(t, "slowpoke")
	get := func(target string) string {
		return "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n\r\n"
	}
	dial := func(t *testing.T) net.Conn {
		nc, err := net.Dial("tcp", gw.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nc.Close() })
		return nc
	}

	t.Run("trickled head", func(t *testing.T) {
		// A byte every 350 ms: the 8 bytes read to tell an upgrade from
		// an API request take most of the timeout, and the rest would
		// take far longer.
		nc := dial(t)
		start := time.Now()
		go trickle(nc, get("/api/presence/users/slowpoke"), 350*time.Millisecond)
		got, took := readUntilCut(t, nc, start, 3*timeout)
		if bytes.HasPrefix(got, []byte("HTTP/1.1 200")) {
			t.Errorf("a trickled request was served: %q", got)
		}
		if took < timeout-100*time.Millisecond || took > timeout+time.Second {
			t.Errorf("cut %v after the accept, want about %v", took, timeout)
		}
	})

	t.Run("idle keep-alive", func(t *testing.T) {
		nc := dial(t)
		br := bufio.NewReader(nc)
		for i := range 2 {
			if _, err := io.WriteString(nc, get("/api/presence/users/slowpoke")); err != nil {
				t.Fatal(err)
			}
			_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d: %s, want 200", i, resp.Status)
			}
		}
		start := time.Now()
		_ = nc.SetReadDeadline(start.Add(timeout + 5*time.Second))
		_, err := br.ReadByte()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("an idle kept-alive connection still open after %v", time.Since(start))
		}
		if took := time.Since(start); took > timeout+2*time.Second {
			t.Errorf("an idle kept-alive connection closed after %v, want about %v", took, timeout)
		}
	})

	for _, tt := range []struct {
		name   string
		pad    int
		status int
	}{
		{"URL within the bound", 20 << 10, http.StatusOK},
		{"URL over the bound", 1 << 20, http.StatusRequestHeaderFieldsTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc := dial(t)
			go func() {
				_ = nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
				_, _ = io.WriteString(nc, get("/api/presence/users/slowpoke?pad="+strings.Repeat("a", tt.pad)))
			}()
			_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Errorf("%s, want %d", resp.Status, tt.status)
			}
		})
	}
	by.check(t)
}

// TestTrickledFrameIsCut: a socket whose bytes keep coming, a byte at a
// time, without ever making a whole frame is not alive: it is closed at
// the connection TTL, like a silent one.
func TestTrickledFrameIsCut(t *testing.T) {
	t.Parallel()
	sys := secStart(t, systest.Options{})
	by := newBystander(t, sys, sys.Gateway())
	gw := sys.Gateway()
	c := secDial(t, gw, "slowpoke")
	// The header of a 4000-byte text frame, then its payload a byte every
	// 100 ms: 400 s to make a frame of it, against a TTL of a second.
	frame := handFrame(true, 0, byte(ws.OpText), true, -1, bytes.Repeat([]byte(" "), 4000))
	start := time.Now()
	go trickle(c.NetConn(), string(frame), 100*time.Millisecond)
	_, took := readUntilCut(t, c.NetConn(), start, systest.TTL+5*time.Second)
	if took > systest.TTL+2*time.Second {
		t.Errorf("cut after %v, want within the TTL (%v) and the sweep", took, systest.TTL)
	}
	awaitOffline(t, sys, "slowpoke")
	by.check(t)
}

// readUntilCut reads nc until the gateway closes it, and returns what it
// read and how long after start it was closed; it fails the test if nc is
// still open wait after start.
func readUntilCut(t *testing.T, nc net.Conn, start time.Time, wait time.Duration) ([]byte, time.Duration) {
	t.Helper()
	_ = nc.SetReadDeadline(start.Add(wait))
	got, err := io.ReadAll(nc)
	took := time.Since(start)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("still open after %v", took)
	}
	return got, took
}

// TestStalledBodyIsCut: an HTTP request whose headers come at once but
// whose announced body never does is cut at the handshake timeout, on a
// path that reads no body (net/http waits for it before answering) as on
// the API.
func TestStalledBodyIsCut(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	sys := secStart(t, systest.Options{})
	gw := sys.StartGateway(gateway.Config{HandshakeTimeout: timeout})
	tok := secLongToken(t, "slowbody")
	for _, tt := range []struct{ name, head string }{
		{"healthz", "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"},
		{"query", "POST /api/presence/query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok +
			"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"user_ids\":"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", gw.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			start := time.Now()
			if _, err := io.WriteString(nc, tt.head); err != nil {
				t.Fatal(err)
			}
			if _, took := readUntilCut(t, nc, start, timeout+5*time.Second); took > timeout+2*time.Second {
				t.Errorf("cut after %v, want about %v", took, timeout)
			}
		})
	}
}

// TestIdleConnectionFlood opens hundreds of TCP connections that never
// send a byte: a real client still connects and is served meanwhile, and
// the gateway cuts every idle one at the handshake timeout.
func TestIdleConnectionFlood(t *testing.T) {
	t.Parallel()
	const (
		flood   = 500
		timeout = time.Second
	)
	// The sockets that must stay up get a long TTL: on a loaded machine
	// this test is about handshakes, not heartbeats.
	live := gateway.Config{ConnTTL: 30 * time.Second}
	sys := secStart(t, systest.Options{Gateway: live})
	by := newBystander(t, sys, sys.Gateway())
	gw := sys.StartGateway(gateway.Config{HandshakeTimeout: timeout, ConnTTL: live.ConnTTL})
	type dialed struct {
		nc net.Conn
		at time.Time
	}
	idle := make([]dialed, 0, flood)
	for range flood {
		nc, err := net.Dial("tcp", gw.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		idle = append(idle, dialed{nc, time.Now()})
	}
	c := secDial(t, gw, "alice")
	defer systest.KeepAlive(c, systest.Heartbeat)()
	subscribeSelf(t, c, "during-flood")
	var wg sync.WaitGroup
	cut := make(chan time.Duration, flood)
	for _, d := range idle {
		wg.Go(func() {
			_ = d.nc.SetReadDeadline(d.at.Add(timeout + 20*time.Second))
			var b [1]byte
			_, err := d.nc.Read(b[:])
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("idle connection still open after %v", time.Since(d.at))
				return
			}
			cut <- time.Since(d.at)
		})
	}
	wg.Wait()
	close(cut)
	latest := time.Duration(0)
	for d := range cut {
		latest = max(latest, d)
	}
	// The handshake timeout counts from the accept, which a busy machine
	// may make late: the bound is loose, what matters is that every idle
	// connection is cut.
	if latest > timeout+10*time.Second {
		t.Errorf("the last idle connection was cut %v after it opened; want about %v", latest, timeout)
	}
	if n := gw.Conns(); n != 1 {
		t.Errorf("gateway holds %d connections, want alice's only", n)
	}
	subscribeSelf(t, c, "after-flood")
	by.check(t)
}

// TestSlowReader runs a client that stops reading while it floods the
// gateway with requests and the users it watches keep changing: what waits
// for its socket stays bounded by its subscriptions, the blocked write
// times out, and the socket is closed and counted as slow, while everyone
// else carries on.
func TestSlowReader(t *testing.T) {
	t.Parallel()
	const (
		watched      = 20
		writeTimeout = 500 * time.Millisecond
	)
	// A TTL far longer than the write timeout: on a loaded machine a
	// reader blocked in writes could otherwise end the socket as dead
	// first, and this test is about the write timeout.
	const ttl = 30 * time.Second
	sys := secStart(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone, ConnTTL: ttl}})
	by := newBystander(t, sys, sys.Gateway())
	gw := sys.StartGateway(gateway.Config{
		Policy:       gateway.PolicyEveryone,
		ConnTTL:      ttl,
		WriteTimeout: writeTimeout,
		RateLimit:    100_000,
		RateBurst:    100_000,
	})
	var users []*client.Conn
	var names []string
	for i := range watched {
		name := fmt.Sprintf("busy%d", i)
		c := secDial(t, sys.Gateway(), name)
		defer systest.KeepAlive(c, systest.Heartbeat)()
		users, names = append(users, c), append(names, name)
	}
	sloth := secDial(t, gw, "sloth")
	if err := sloth.Subscribe("w", names...); err != nil {
		t.Fatal(err)
	}
	systest.Await(t, sloth, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "w"
	})
	// From now on sloth never reads. It floods subscribes of invalid ids,
	// each answered with 100 denied frames, until its socket fills up.
	junk := make([]string, 100)
	for i := range junk {
		junk[i] = fmt.Sprintf("x.%030d", i) // not a user id; 100 of them fit a message
	}
	flood := make(chan struct{})
	go func() {
		defer close(flood)
		for range 5000 {
			_ = sloth.NetConn().SetWriteDeadline(time.Now().Add(2 * time.Second))
			if err := sloth.Subscribe("j", junk...); err != nil {
				return
			}
		}
	}()

	// Meanwhile the watched users keep changing, ten times a second each
	// (under the rate limit), until sloth is gone.
	var changes sync.WaitGroup
	stopChanges := make(chan struct{})
	for _, c := range users {
		changes.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for i := range 300 {
				select {
				case <-stopChanges:
					return
				case <-tick.C:
				}
				st := "busy"
				if i%2 == 1 {
					st = "online"
				}
				if c.SetStatus(st) != nil {
					return
				}
			}
		})
	}
	maxPending, polls := 0, 0
	natstest.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		n, ok := gw.PendingUpdates("sloth", sloth.Hello.ConnID)
		if !ok {
			return nil // closed
		}
		polls++
		maxPending = max(maxPending, n)
		if n > watched {
			t.Fatalf("%d presence changes wait for a socket watching %d users", n, watched)
		}
		return fmt.Errorf("sloth still connected, %d changes pending", n)
	})
	close(stopChanges)
	changes.Wait()
	<-flood
	if maxPending == 0 {
		t.Errorf("no change ever waited for the blocked socket: the test did not block it")
	}
	t.Logf("sloth closed after %d polls; at most %d pending changes", polls, maxPending)
	if got := metricValue(t, gw, "greendot_gateway_slow_socket_closes_total", nil); got != 1 {
		t.Errorf("slow socket closes = %v, want 1", got)
	}
	if err := awaitGone(t, sloth, 5*time.Second); err == nil {
		t.Errorf("sloth's socket still open")
	}
	awaitOffline(t, sys, "sloth")
	by.check(t)
}

// TestRequestsWaitingAreBounded: while one connection's subscribes wait
// (held here between the gateway's decision and its registration), at
// most MaxQueued more wait behind it and the next are refused with
// rate_limited. A status chosen meanwhile is never refused: the newest
// choice is written. Once the hold ends, every queued subscribe is
// answered.
func TestRequestsWaitingAreBounded(t *testing.T) {
	t.Parallel()
	sys := systest.Start(t, systest.Options{})
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	a := sys.Dial(gw, "alice")
	defer systest.KeepAlive(a, systest.Heartbeat)()

	held, releaseOnce := holdDecision(t, gw)
	if err := a.Subscribe("s0", "bob"); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, held, "the first subscribe to reach the authorizer")
	const refused = 2
	for i := 1; i <= gateway.MaxQueued+refused; i++ {
		if err := a.Subscribe(fmt.Sprintf("s%d", i), "bob"); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []string{"away", "busy"} {
		if err := a.SetStatus(st); err != nil {
			t.Fatal(err)
		}
	}
	for i := gateway.MaxQueued; i < gateway.MaxQueued+refused; i++ {
		id := fmt.Sprintf("s%d", i+1)
		m := systest.Await(t, a, systest.EventTimeout, "refusal of "+id, isType(protocol.TypeError))
		if m.ID != id || m.Code != protocol.CodeRateLimited || !strings.Contains(m.Message, "in progress") {
			t.Errorf("got %+v, want rate_limited for %s", m, id)
		}
	}
	// The choice is written though the requests are held (the socket's
	// frames wait for presence_init).
	natstest.CheckFor(t, systest.EventTimeout, 10*time.Millisecond, func() error {
		rec, _, err := sys.Store.Status(context.Background(), "alice")
		if err != nil {
			return err
		}
		if rec.ChosenStatus() != presence.Busy {
			return fmt.Errorf("alice's record says %s, want busy", rec.ChosenStatus())
		}
		return nil
	})

	releaseOnce()
	// Every queued subscribe is answered, and the socket hears of its
	// choice, in whatever order the two come.
	answered := map[string]bool{}
	sawBusy := false
	for len(answered) <= gateway.MaxQueued || !sawBusy {
		switch m := systest.Next(t, a, systest.EventTimeout); m.Type {
		case protocol.TypePresenceInit:
			answered[m.ID] = true
		case protocol.TypeSelf:
			sawBusy = sawBusy || m.Status == presence.Busy && m.Devices == 1
		case protocol.TypeError:
			t.Fatalf("error after the hold: %+v", m)
		}
	}
	for i := range gateway.MaxQueued + 1 {
		if !answered[fmt.Sprintf("s%d", i)] {
			t.Errorf("subscribe s%d never answered", i)
		}
	}
}

// holdDecision has the gateway's next subscribe wait between its decision
// and its registration until release is called, or the test ends; held
// is closed once it waits. The socket's later requests queue behind it.
func holdDecision(t *testing.T, gw *systest.Gateway) (held <-chan struct{}, release func()) {
	h, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	gw.AfterDecide(func() {
		once.Do(func() {
			close(h)
			<-r
		})
	})
	release = sync.OnceFunc(func() { close(r) })
	t.Cleanup(release)
	return h, release
}
