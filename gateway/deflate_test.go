package gateway_test

import (
	"bufio"
	"bytes"
	"compress/flate"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsflate"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// deflateStart starts a system whose raw sockets need no heartbeat for a
// minute, under the everyone policy: a subscribe to many users needs no
// follows.
func deflateStart(t *testing.T, cfg gateway.Config) *systest.System {
	t.Helper()
	cfg.ConnTTL, cfg.HeartbeatInterval, cfg.Policy = time.Minute, 20*time.Second, gateway.PolicyEveryone
	return systest.Start(t, systest.Options{Gateway: cfg, NoReaper: true, NoFanout: true})
}

// rawWS is a WebSocket upgraded and read by hand, to see its frames' RSV1
// bits and send frames a client library would not.
type rawWS struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
	// extensions is the Sec-WebSocket-Extensions of the 101, "" if none.
	extensions string
}

// dialRaw upgrades as user, offering the extensions in offer (none if
// empty), and reads the 101 and hello.
func dialRaw(t *testing.T, gw *systest.Gateway, user, offer string) *rawWS {
	t.Helper()
	nc, err := net.DialTimeout("tcp", gw.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	req := "GET /ws?user=" + user + " HTTP/1.1\r\nHost: " + gw.Addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	if offer != "" {
		req += "Sec-WebSocket-Extensions: " + offer + "\r\n"
	}
	if _, err := io.WriteString(nc, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %s", resp.Status)
	}
	r := &rawWS{t: t, nc: nc, br: br, extensions: strings.Join(resp.Header.Values("Sec-WebSocket-Extensions"), ", ")}
	if m, _ := r.read(); !strings.Contains(string(m), `"type":"hello"`) {
		t.Fatalf("first frame %q, not hello", m)
	}
	return r
}

// next reads a frame, and returns its header and (unmasked) payload.
func (r *rawWS) next() (ws.Header, []byte) {
	r.t.Helper()
	h, err := ws.ReadHeader(r.br)
	if err != nil {
		r.t.Fatal(err)
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(r.br, p); err != nil {
		r.t.Fatal(err)
	}
	return h, p
}

// read reads a text message of one frame, inflated if it came compressed,
// and reports whether it did.
func (r *rawWS) read() ([]byte, bool) {
	r.t.Helper()
	h, p := r.next()
	if h.OpCode != ws.OpText || !h.Fin {
		r.t.Fatalf("frame %v fin %v (%q), want one text frame", h.OpCode, h.Fin, p)
	}
	if h.Rsv == 0 {
		return p, false
	}
	if h.Rsv != ws.Rsv(true, false, false) {
		r.t.Fatalf("RSV bits %03b", h.Rsv)
	}
	f, err := wsflate.DecompressFrame(ws.Frame{Header: h, Payload: p})
	if err != nil {
		r.t.Fatal(err)
	}
	return f.Payload, true
}

// readType reads messages until one of type typ, which it returns with
// whether it came compressed.
func (r *rawWS) readType(typ string) ([]byte, bool) {
	r.t.Helper()
	for {
		m, z := r.read()
		if strings.Contains(string(m), `"type":"`+typ+`"`) {
			return m, z
		}
	}
}

// send writes frames, masked.
func (r *rawWS) send(frames ...ws.Frame) {
	r.t.Helper()
	var b bytes.Buffer
	for _, f := range frames {
		if err := ws.WriteFrame(&b, ws.MaskFrame(f)); err != nil {
			r.t.Fatal(err)
		}
	}
	if _, err := r.nc.Write(b.Bytes()); err != nil {
		r.t.Fatal(err)
	}
}

// closed reads frames until a close frame, and returns its code.
func (r *rawWS) closed() ws.StatusCode {
	r.t.Helper()
	for {
		h, p := r.next()
		if h.OpCode == ws.OpClose {
			code, _ := ws.ParseCloseFrameData(p)
			return code
		}
	}
}

// deflateFrame returns msg as one compressed text frame, RSV1 set.
func deflateFrame(t *testing.T, msg []byte) ws.Frame {
	t.Helper()
	f, err := wsflate.CompressFrame(ws.NewTextFrame(msg))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// subscribeMsg is a subscribe to n users.
func subscribeMsg(t *testing.T, id string, n int) []byte {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("deflate-peer-%03d", i)
	}
	b, err := json.Marshal(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: id, UserIDs: ids})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// chromeOffer is what Chrome offers.
const chromeOffer = "permessage-deflate; client_max_window_bits"

// TestDeflateNegotiated: a client that offers permessage-deflate as
// Chrome does gets it with no context takeover either way; its hello
// (small) comes as it is, its presence_init of 100 users compressed
// (RSV1), inflating to the very JSON a client without compression gets;
// its own compressed subscribes, whole or in fragments around a ping,
// are answered as uncompressed ones are; the upgrade is counted.
func TestDeflateNegotiated(t *testing.T) {
	t.Parallel()
	sys := deflateStart(t, gateway.Config{})
	gw := sys.Gateway()
	r := dialRaw(t, gw, "alice", chromeOffer)
	if want := "permessage-deflate;server_no_context_takeover;client_no_context_takeover"; r.extensions != want {
		t.Fatalf("extensions %q, want %q", r.extensions, want)
	}
	plain := dialRaw(t, gw, "bob", "")
	if plain.extensions != "" {
		t.Fatalf("no offer, but extensions %q", plain.extensions)
	}
	sub := subscribeMsg(t, "s1", 100)
	plain.send(ws.NewTextFrame(sub))
	want, z := plain.readType(protocol.TypePresenceInit)
	if z {
		t.Fatal("a frame compressed for a client that offered nothing")
	}

	// Compressed, whole.
	r.send(deflateFrame(t, sub))
	got, z := r.readType(protocol.TypePresenceInit)
	if !z {
		t.Fatalf("presence_init of %d bytes not compressed", len(got))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("inflated presence_init\n%s\nwant\n%s", got, want)
	}
	// Compressed, in three fragments, a ping between them.
	sub2 := subscribeMsg(t, "s2", 100)
	zf := deflateFrame(t, sub2)
	third := len(zf.Payload) / 3
	first := ws.NewFrame(ws.OpText, false, zf.Payload[:third])
	first.Header.Rsv = zf.Header.Rsv
	r.send(first, ws.NewPingFrame([]byte("p")),
		ws.NewFrame(ws.OpContinuation, false, zf.Payload[third:2*third]),
		ws.NewFrame(ws.OpContinuation, true, zf.Payload[2*third:]))
	if h, p := r.next(); h.OpCode != ws.OpPong || string(p) != "p" || h.Rsv != 0 {
		t.Fatalf("answer to the ping: %v %q rsv %03b", h.OpCode, p, h.Rsv)
	}
	got, z = r.read()
	if want2 := bytes.Replace(want, []byte(`"id":"s1"`), []byte(`"id":"s2"`), 1); !z || !bytes.Equal(got, want2) {
		t.Fatalf("answer to the fragmented subscribe (compressed %v):\n%s\nwant\n%s", z, got, want2)
	}
	// Small frames go as they are: a heartbeat's answer is none, a
	// set_status's a self frame.
	r.send(deflateFrame(t, []byte(`{"type":"set_status","status":"busy"}`)))
	if got, z := r.readType("self"); z || !strings.Contains(string(got), `"busy"`) {
		t.Fatalf("after set_status: %q (compressed %v)", got, z)
	}
	if v := metricValue(t, gw, "greendot_gateway_upgrades_compressed_total", nil); v != 1 {
		t.Errorf("compressed upgrades counted %v, want 1", v)
	}
}

// TestDeflateRefused: a gateway with NoCompression answers an offer
// with no extension and sends every frame as it is; a frame with RSV1 on
// a socket that did not negotiate (a client that compresses anyway) is a
// protocol error, 1002, on either gateway. pkg/client's offer is declined
// there and its Read works on.
func TestDeflateRefused(t *testing.T) {
	t.Parallel()
	sys := deflateStart(t, gateway.Config{NoCompression: true})
	off := sys.Gateway()
	on := sys.StartGateway(gateway.Config{ConnTTL: time.Minute, HeartbeatInterval: 20 * time.Second, Policy: gateway.PolicyEveryone})

	r := dialRaw(t, off, "alice", chromeOffer)
	if r.extensions != "" {
		t.Fatalf("compression off, but extensions %q", r.extensions)
	}
	r.send(ws.NewTextFrame(subscribeMsg(t, "s1", 100)))
	if got, z := r.readType(protocol.TypePresenceInit); z {
		t.Fatalf("presence_init compressed: %.80q", got)
	}
	r.send(deflateFrame(t, subscribeMsg(t, "s2", 10)))
	if code := r.closed(); code != ws.StatusProtocolError {
		t.Errorf("RSV1 with compression off: close %d, want 1002", code)
	}

	r = dialRaw(t, on, "bob", "")
	r.send(deflateFrame(t, subscribeMsg(t, "s3", 10)))
	if code := r.closed(); code != ws.StatusProtocolError {
		t.Errorf("RSV1 with no offer: close %d, want 1002", code)
	}

	c, err := client.Dial(context.Background(), off.WS+"?user=carol", client.Options{Compression: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Compressed() {
		t.Error("pkg/client says compressed with compression off")
	}
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: "s", UserIDs: []string{"alice"}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, _, err := c.Read()
		if err != nil {
			t.Fatal(err)
		}
		if m.Type == protocol.TypePresenceInit {
			break
		}
	}
}

// TestDeflateOffers: what the gateway answers offers with. Offers with a
// parameter it does not know, a repeated one, a bad value, or
// server_max_window_bits (compress/flate's window is always 32 KiB; any
// value is declined) are declined, with the upgrade accepted uncompressed, as RFC 7692
// §5 asks; the first acceptable offer of several is taken. A header that
// cannot be parsed is a bad request.
func TestDeflateOffers(t *testing.T) {
	t.Parallel()
	sys := deflateStart(t, gateway.Config{})
	gw := sys.Gateway()
	const accepted = "permessage-deflate;server_no_context_takeover;client_no_context_takeover"
	for i, tc := range []struct{ offer, want string }{
		{"permessage-deflate", accepted},                            // Firefox
		{"permessage-deflate; client_max_window_bits", accepted},    // Chrome
		{"permessage-deflate; client_max_window_bits=10", accepted}, // a client that would compress with less
		{"permessage-deflate; server_no_context_takeover; client_no_context_takeover", accepted},
		{"x-webkit-deflate-frame", ""},
		{"permessage-deflate; server_max_window_bits=10", ""},
		{"permessage-deflate; server_max_window_bits=15", ""},
		{"permessage-deflate; frobnicate", ""},
		{"permessage-deflate; client_no_context_takeover=1", ""},
		{"permessage-deflate; server_no_context_takeover; server_no_context_takeover", ""},
		{"permessage-deflate; client_max_window_bits=99", ""},
		{"permessage-deflate; server_max_window_bits=10, permessage-deflate", accepted},
		{"permessage-deflate; frobnicate, permessage-deflate; client_max_window_bits", accepted},
	} {
		r := dialRaw(t, gw, fmt.Sprintf("offer%02d", i), tc.offer)
		if r.extensions != tc.want {
			t.Errorf("offer %q: extensions %q, want %q", tc.offer, r.extensions, tc.want)
		}
		_ = r.nc.Close()
	}
	// A header that is not a list of extensions at all breaks RFC 6455
	// (§9.1): 400, counted as a bad request, as gobwas/ws answers it.
	before := metricValue(t, gw, "greendot_gateway_upgrades_total", map[string]string{"result": "bad_request"})
	for _, h := range []string{"permessage-deflate;;", `permessage-deflate; client_max_window_bits="`} {
		if line := rawUpgrade(t, gw.Addr, "/ws?user=malformed", "Sec-WebSocket-Extensions: "+h); !strings.HasPrefix(line, "HTTP/1.1 400") {
			t.Errorf("extensions %q: %q, want HTTP/1.1 400", h, line)
		}
	}
	if after := metricValue(t, gw, "greendot_gateway_upgrades_total", map[string]string{"result": "bad_request"}); after != before+2 {
		t.Errorf("bad requests counted %v, want %v", after, before+2)
	}
}

// TestDeflateBombRefused: a compressed message that inflates past the
// message size limit (4 KiB) is refused with 1009 as soon as its output
// passes it: 4 MiB of zeros, compressed to a frame within the limit. Bad
// deflate data is 1007, RSV1 on a ping 1002; the gateway serves the next
// socket as before.
func TestDeflateBombRefused(t *testing.T) {
	t.Parallel()
	sys := deflateStart(t, gateway.Config{})
	gw := sys.Gateway()
	var b bytes.Buffer
	w, _ := flate.NewWriter(&b, flate.BestCompression)
	_, _ = w.Write(make([]byte, 4<<20))
	_ = w.Flush()
	bomb := bytes.TrimSuffix(b.Bytes(), []byte{0, 0, 0xff, 0xff})
	if len(bomb) > gateway.DefaultMaxMessageSize {
		t.Fatalf("a bomb of %d bytes is over the limit itself", len(bomb))
	}
	r := dialRaw(t, gw, "mallory", chromeOffer)
	f := ws.NewTextFrame(bomb)
	f.Header.Rsv = ws.Rsv(true, false, false)
	r.send(f)
	if code := r.closed(); code != ws.StatusMessageTooBig {
		t.Errorf("bomb: close %d, want 1009", code)
	}
	// Bad deflate data is 1007.
	r = dialRaw(t, gw, "mallory", chromeOffer)
	f = ws.NewTextFrame([]byte{0xff, 0xff, 0xff})
	f.Header.Rsv = ws.Rsv(true, false, false)
	r.send(f)
	if code := r.closed(); code != ws.StatusInvalidFramePayloadData {
		t.Errorf("bad deflate data: close %d, want 1007", code)
	}
	// RSV1 on a ping is 1002.
	r = dialRaw(t, gw, "mallory", chromeOffer)
	f = ws.NewPingFrame([]byte("p"))
	f.Header.Rsv = ws.Rsv(true, false, false)
	r.send(f)
	if code := r.closed(); code != ws.StatusProtocolError {
		t.Errorf("RSV1 on a ping: close %d, want 1002", code)
	}
	r = dialRaw(t, gw, "alice", chromeOffer)
	r.send(deflateFrame(t, subscribeMsg(t, "s", 100)))
	if _, z := r.readType(protocol.TypePresenceInit); !z {
		t.Error("next socket's presence_init not compressed")
	}
}

// TestClientCompression: pkg/client with Compression offers it, the
// gateway accepts, and Read inflates what comes compressed: a
// presence_init of 100 users reads as one without compression does.
func TestClientCompression(t *testing.T) {
	t.Parallel()
	sys := deflateStart(t, gateway.Config{})
	gw := sys.Gateway()
	read := func(compression bool) []byte {
		c, err := client.Dial(context.Background(), gw.WS+"?user=watcher", client.Options{Compression: compression})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.Compressed() != compression {
			t.Fatalf("asked for compression %v, got %v", compression, c.Compressed())
		}
		var m protocol.ClientMessage
		if err := json.Unmarshal(subscribeMsg(t, "s", 100), &m); err != nil {
			t.Fatal(err)
		}
		if err := c.Send(m); err != nil {
			t.Fatal(err)
		}
		for {
			m, raw, err := c.Read()
			if err != nil {
				var ce *client.CloseError
				if errors.As(err, &ce) {
					t.Fatalf("closed: %v", ce)
				}
				t.Fatal(err)
			}
			if m.Type == protocol.TypePresenceInit {
				if len(m.Users) != 100 {
					t.Fatalf("presence_init of %d users", len(m.Users))
				}
				return raw
			}
		}
	}
	if z, plain := read(true), read(false); !bytes.Equal(z, plain) {
		t.Errorf("compressed\n%s\nplain\n%s", z, plain)
	}
}

// TestClientConfigCompression: a Client with Config.Compression gets its
// Snapshot of 100 users through a compressed connection, counted by the
// gateway, as a Client without it does through a plain one.
func TestClientConfigCompression(t *testing.T) {
	t.Parallel()
	sys := deflateStart(t, gateway.Config{})
	gw := sys.Gateway()
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("deflate-peer-%03d", i)
	}
	for _, compression := range []bool{true, false} {
		before := metricValue(t, gw, "greendot_gateway_upgrades_compressed_total", nil)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, err := client.Connect(ctx, gw.WS, client.Config{User: "watcher", Compression: compression})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if err := c.Subscribe(ids...); err != nil {
			t.Fatal(err)
		}
		users := 0
		for ev := range c.Events() {
			if s, ok := ev.(client.Snapshot); ok {
				users += len(s.Users)
				if users == len(ids) {
					break
				}
			}
		}
		_ = c.Close()
		cancel()
		if users != len(ids) {
			t.Fatalf("compression %v: snapshots of %d users, want %d (%v)", compression, users, len(ids), c.Err())
		}
		counted := metricValue(t, gw, "greendot_gateway_upgrades_compressed_total", nil) - before
		if want := map[bool]float64{true: 1, false: 0}[compression]; counted != want {
			t.Errorf("compression %v: %v compressed upgrades counted, want %v", compression, counted, want)
		}
	}
}
