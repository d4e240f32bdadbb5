package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// The fuzz targets of the gateway. Their seed corpora are checked in under
// testdata/fuzz/<target>/ and run with every `go test`; to fuzz, run one
// target at a time for a bounded time, e.g.
//
//	go test ./gateway -run '^$' -fuzz '^FuzzDecodeClient$' -fuzztime 20s
//	go test ./gateway -run '^$' -fuzz '^FuzzClientMessage$' -fuzztime 20s
//	go test ./gateway -run '^$' -fuzz '^FuzzFrames$' -fuzztime 20s

// FuzzDecodeClient feeds arbitrary bytes to protocol.DecodeClient, the
// decoding of every client message: it must never panic, must refuse
// anything that is not a JSON object with a string type with an error
// wrapping protocol.ErrBadRequest, and what it accepts must survive a
// round trip through encoding.
func FuzzDecodeClient(f *testing.F) {
	for _, s := range []string{
		`{"type":"heartbeat"}`,
		`{"type":"subscribe","id":"1","user_ids":["bob","carol"]}`,
		`{"type":"subscribe","all":true}`,
		`{"type":"set_status","status":"busy","id":"x"}`,
		`{"type":"auth","token":"a.b.c"}`,
		`{"type":"unsubscribe","user_ids":[]}`,
		` {"type":"idle"} `,
		`{"type":5}`,
		`{"type":"subscribe","user_ids":"bob"}`,
		`{"type":"subscribe","user_ids":[1]}`,
		`{"type":"x","all":"yes"}`,
		`[]`, `null`, `"heartbeat"`, `{`, ``,
		`{"type":"heartbeat","type":"activity"}`,
		`{"type":"\u0000"}`,
		`{"TYPE":"heartbeat"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m := protocol.ClientMessage{Type: "stale", ID: "stale", UserIDs: []string{"stale"}}
		err := protocol.DecodeClient(data, &m)
		if err != nil {
			if !errors.Is(err, protocol.ErrBadRequest) {
				t.Fatalf("DecodeClient(%q) = %v, which does not wrap ErrBadRequest", data, err)
			}
			if err.Error() == "" {
				t.Fatalf("DecodeClient(%q): error without a message", data)
			}
			return
		}
		if m.Type == "" {
			t.Fatalf("DecodeClient(%q) accepted a message without a type: %+v", data, m)
		}
		if trimmed := bytes.TrimSpace(data); len(trimmed) == 0 || trimmed[0] != '{' {
			t.Fatalf("DecodeClient(%q) accepted something that is not an object", data)
		}
		enc, err := json.Marshal(&m)
		if err != nil {
			t.Fatalf("encode %+v: %v", m, err)
		}
		var again protocol.ClientMessage
		if err := protocol.DecodeClient(enc, &again); err != nil {
			t.Fatalf("DecodeClient(%s), the encoding of %+v: %v", enc, m, err)
		}
		if !reflect.DeepEqual(normalize(m), normalize(again)) {
			t.Fatalf("round trip of %q: %+v, then %+v", data, m, again)
		}
	})
}

// normalize makes an empty user_ids array and a missing one compare equal
// (the encoding leaves out an empty one).
func normalize(m protocol.ClientMessage) protocol.ClientMessage {
	if len(m.UserIDs) == 0 {
		m.UserIDs = nil
	}
	return m
}

// fuzzStoreEnv names the directory under which the fuzzing workers' NATS
// servers keep their stores: the coordinator's own temporary directory,
// handed to the workers it starts in their environment.
const fuzzStoreEnv = "GATEWAY_FUZZ_STORE_DIR"

// fuzzStoreDir returns the directory for this process's NATS server's
// store. A fuzzing worker still busy with an input when the fuzzing ends
// is killed before its cleanups run, and would leave its store behind in
// the temporary directory: a worker's is inside its coordinator's
// temporary directory, which the coordinator, which outlives its
// workers, removes with everything in it. Without fuzzing, the process
// is the only one, and its store is its temporary directory.
func fuzzStoreDir(f *testing.F) string {
	if parent := os.Getenv(fuzzStoreEnv); parent != "" {
		dir, err := os.MkdirTemp(parent, "worker")
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { _ = os.RemoveAll(dir) })
		return dir
	}
	dir := f.TempDir()
	f.Setenv(fuzzStoreEnv, dir) // read by the workers f.Fuzz starts
	return dir
}

// fuzzGateway is a gateway on an embedded NATS server, with one client
// socket that FuzzClientMessage sends to and a bystander whose state must
// not change.
type fuzzGateway struct {
	svc       *Service
	url       string
	store     *presence.Store
	conn      *client.Conn
	bystander presence.Record
	n         int
}

// startFuzzGateway starts a gateway with cfg's limits, dev auth, a long
// TTL and its buckets in memory.
func startFuzzGateway(f *testing.F, cfg Config) *fuzzGateway {
	srv := natstest.RunServerWithOptions(f, &server.Options{StoreDir: fuzzStoreDir(f)})
	nc := natstest.Connect(f, srv)
	cfg.DevAuth = true
	cfg.ConnTTL = 5 * time.Minute
	// In memory: a fuzzing worker killed in the middle of an input
	// leaves its store for the coordinator to remove (fuzzStoreDir), and
	// nothing of it need outlast the worker.
	cfg.Buckets = presence.BucketOptions{Storage: jetstream.MemoryStorage}
	svc, err := New(nc, cfg)
	if err != nil {
		f.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, ln) }()
	f.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.Errorf("serve: %v", err)
		}
	})
	natstest.CheckFor(f, 10*time.Second, 10*time.Millisecond, func() error { return svc.Ready(ctx) })
	g := &fuzzGateway{svc: svc, url: "ws://" + ln.Addr().String() + WebSocketPath, store: svc.store}
	// The fuzzer's socket goes before the gateway stops: a socket the
	// gateway closes itself lingers until its client answers the close,
	// which this one, read only by the inputs, never does; and a fuzzing
	// worker given a second to stop is killed before its cleanups have
	// removed the NATS server's store.
	f.Cleanup(func() {
		if g.conn != nil {
			_ = g.conn.Abort()
		}
	})
	for _, e := range [][2]string{{"fuzzer", "friend"}, {"friend", "fuzzer"}} {
		if err := g.store.Follow(ctx, e[0], e[1]); err != nil {
			f.Fatal(err)
		}
	}
	friend, err := client.Dial(ctx, g.url+"?user=friend", client.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = friend.Abort() })
	if g.bystander, _, err = g.store.Status(ctx, "friend"); err != nil {
		f.Fatal(err)
	}
	return g
}

// socket returns the fuzzer's socket, connecting it again if the previous
// input closed it.
func (g *fuzzGateway) socket(t *testing.T) *client.Conn {
	if g.conn == nil {
		c, err := client.Dial(context.Background(), g.url+"?user=fuzzer", client.Options{})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		g.conn = c
	}
	return g.conn
}

// FuzzClientMessage sends arbitrary text messages on a real socket to a
// real gateway. Every input must be answered as docs/protocol.md says: with
// frames of known types and codes, replies echoing the message's id, the
// socket kept open (or closed with 1007 for invalid UTF-8, 1009 for an
// oversized message, 1008 for a bad auth), the gateway still serving the
// next message, and another user's status record untouched.
func FuzzClientMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"heartbeat"}`,
		`{"type":"activity","id":"a"}`,
		`{"type":"idle"}`,
		`{"type":"set_status","status":"busy","id":"s"}`,
		`{"type":"set_status","status":"invisible"}`,
		`{"type":"set_status","status":"offline","id":"bad"}`,
		`{"type":"subscribe","id":"1","user_ids":["friend","stranger","bad id"]}`,
		`{"type":"subscribe","id":"2","user_ids":["fuzzer","fuzzer"]}`,
		`{"type":"subscribe","all":true,"id":"all"}`,
		`{"type":"subscribe","id":"none","user_ids":[]}`,
		`{"type":"unsubscribe","user_ids":["friend"]}`,
		`{"type":"auth","token":"x","id":"t"}`,
		`{"type":"dance","id":"d"}`,
		`{"id":"no-type"}`,
		`not json`,
		"\xff",
	} {
		f.Add([]byte(s))
	}
	// Larger than a read: the gateway stops at its header, and its close
	// must still reach the client.
	f.Add(bytes.Repeat([]byte("x"), 40_000))
	g := startFuzzGateway(f, Config{RateLimit: 1e6, RateBurst: 1e6})
	maxMsg := g.svc.cfg.MaxMessageSize
	knownTypes := map[string]bool{
		protocol.TypePresenceInit: true, protocol.TypePresenceBatch: true, protocol.TypeSelf: true,
		protocol.TypeDenied: true, protocol.TypeError: true,
	}
	knownCodes := map[string]bool{
		protocol.CodeBadRequest: true, protocol.CodeUnknownType: true, protocol.CodeInvalidStatus: true,
		protocol.CodeUnauthorized: true,
	}
	knownReasons := map[string]bool{
		protocol.ReasonNotMutualFollowers: true, protocol.ReasonInvalidUserID: true, protocol.ReasonNotAllowed: true,
		protocol.ReasonTooManySubscriptions: true,
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := g.socket(t)
		defer func() {
			if t.Failed() {
				// Whatever state the socket is in, the next input starts
				// on a new one.
				_ = c.Abort()
				g.conn = nil
			}
		}()
		var m protocol.ClientMessage
		decodeErr := protocol.DecodeClient(data, &m)
		var wantClose ws.StatusCode
		switch {
		case len(data) > maxMsg:
			wantClose = ws.StatusMessageTooBig
		case !utf8.Valid(data):
			wantClose = ws.StatusInvalidFramePayloadData
		case decodeErr == nil && m.Type == protocol.TypeAuth:
			wantClose = ws.StatusPolicyViolation // no token is valid here
		}
		if err := c.SendRaw(ws.OpText, data); err != nil {
			t.Fatalf("send: %v", err)
		}
		g.n++
		syncID := fmt.Sprintf("\x00sync-%d", g.n)
		if wantClose == 0 {
			if err := c.Subscribe(syncID, "fuzzer"); err != nil {
				t.Fatalf("send: %v", err)
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for range 10_000 {
			msg, raw, err := c.Read()
			if err != nil {
				var ce *client.CloseError
				closed := errors.As(err, &ce) && ce.Code == wantClose
				if wantClose == 0 || !closed {
					t.Fatalf("after %q: %v (%s), want close %d", data, err, raw, wantClose)
				}
				_ = c.Abort()
				g.conn = nil
				break
			}
			if !knownTypes[msg.Type] {
				t.Fatalf("after %q: frame of unknown type: %s", data, raw)
			}
			if msg.ID == syncID {
				if msg.Type != protocol.TypePresenceInit {
					t.Fatalf("sync answered with %s", raw)
				}
				break
			}
			switch msg.Type {
			case protocol.TypeError:
				if !knownCodes[msg.Code] || msg.Message == "" {
					t.Fatalf("after %q: %s", data, raw)
				}
				if decodeErr == nil && msg.ID != m.ID {
					t.Fatalf("after %q: error does not echo id %q: %s", data, m.ID, raw)
				}
			case protocol.TypeDenied:
				if !knownReasons[msg.Reason] || msg.ID != m.ID {
					t.Fatalf("after %q: %s", data, raw)
				}
			case protocol.TypePresenceInit:
				if msg.ID != m.ID {
					t.Fatalf("after %q: presence_init does not echo id %q: %s", data, m.ID, raw)
				}
			}
		}
		g.checkBystander(t, data)
	})
}

// checkBystander fails the test if the friend's status record changed.
func (g *fuzzGateway) checkBystander(t *testing.T, data []byte) {
	t.Helper()
	rec, _, err := g.store.Status(context.Background(), "friend")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rec.Conns, g.bystander.Conns) || rec.Status != g.bystander.Status {
		t.Fatalf("after %q: the friend's record changed: %+v, was %+v", data, rec, g.bystander)
	}
}

// FuzzFrames' gateway lets a socket send fuzzFramesBurst frames at once
// and hardly any after (the bucket refills once in days), and closes it at
// the fuzzFramesStrikes+1st frame refused, so that a flood reaches both
// soon; its messages are at most 256 bytes, the least allowed.
const (
	fuzzFramesBurst   = 8
	fuzzFramesStrikes = 4
	fuzzFramesMaxMsg  = 256
	// fuzzFramesMaxBytes bounds the bytes of one input's frames: all of
	// them are read by a gateway closing the socket (its linger reads up
	// to 1 MiB), so that no reset destroys its close frame.
	fuzzFramesMaxBytes = 256 << 10
)

// fuzzOps are the op codes a frame of FuzzFrames may have: the six of RFC
// 6455, a reserved data one and a reserved control one.
var fuzzOps = [8]ws.OpCode{ws.OpText, ws.OpContinuation, ws.OpPing, ws.OpPong, ws.OpClose, ws.OpBinary, 0x3, 0xb}

// fuzzRepeats are how many times a frame of FuzzFrames may be sent.
var fuzzRepeats = [4]int{1, fuzzFramesBurst, 64, 1024}

// fuzzFrames builds the frames data describes, one after another: each
// from a head byte, a length byte and as many payload bytes (fewer at the
// end of data). The head byte's bits 0-2 pick the op code of fuzzOps, bit
// 3 makes the frame final, bit 4 leaves it unmasked, bit 5 sets the first
// reserved bit, and bits 6-7 repeat it as fuzzRepeats says: floods. The
// length field is always the payload's, so every frame is whole.
func fuzzFrames(data []byte) []byte {
	var out []byte
	for len(data) >= 2 {
		head, n := data[0], int(data[1])
		payload := bytes.Clone(data[2:][:min(n, len(data)-2)])
		data = data[2+len(payload):]
		h := ws.Header{
			Fin:    head&0x08 != 0,
			OpCode: fuzzOps[head&0x07],
			Masked: head&0x10 == 0,
			Length: int64(len(payload)),
		}
		if head&0x20 != 0 {
			h.Rsv = 0x4
		}
		if h.Masked {
			h.Mask = [4]byte{0x5a, 0x01, 0xc3, 0x7e}
			ws.Cipher(payload, h.Mask, 0)
		}
		var b bytes.Buffer
		_ = ws.WriteHeader(&b, h)
		b.Write(payload)
		for range fuzzRepeats[head>>6] {
			if len(out)+b.Len() > fuzzFramesMaxBytes {
				return out
			}
			out = append(out, b.Bytes()...)
		}
	}
	return out
}

// frameModel works out what the gateway answers to a sequence of frames,
// by the rules docs/protocol.md and docs/security.md give, from what the
// gateway's decoder finds in it (a socket.Sink): every frame but a close
// takes one of burst tokens, and each one over is refused (a message one
// of whose frames was refused is dropped), with a rate_limited error, up
// to strikes of them, the next closing with 1008; an auth message closes
// with 1008 (no token is valid here), a close frame is answered with its
// code (1000 for none, 1002 for a malformed one), a protocol violation
// closes with the decoder's code.
type frameModel struct {
	burst, strikes int
	probe          []byte

	taken, refused int
	dropping       bool
	// close is the code the socket is closed with; 0 while it stays open.
	close ws.StatusCode
	// served says the probe was served.
	served bool
}

var _ socket.Sink = (*frameModel)(nil)

// take takes a token for a frame, and reports whether there was one.
func (m *frameModel) take() bool {
	if m.taken++; m.taken <= m.burst {
		return true
	}
	if m.refused++; m.refused > m.strikes {
		m.close = ws.StatusPolicyViolation
	}
	return false
}

// errors is how many rate_limited errors the socket gets.
func (m *frameModel) errors() int { return min(m.refused, m.strikes) }

func (m *frameModel) Message(p []byte) bool {
	dropped := m.dropping
	m.dropping = false
	if !m.take() || dropped {
		return m.close == 0
	}
	var cm protocol.ClientMessage
	if protocol.DecodeClient(p, &cm) == nil && cm.Type == protocol.TypeAuth {
		m.close = ws.StatusPolicyViolation
		return false
	}
	m.served = m.served || bytes.Equal(p, m.probe)
	return true
}

func (m *frameModel) Fragment([]byte) bool {
	if !m.take() {
		m.dropping = true
	}
	return m.close == 0
}

func (m *frameModel) Control(op ws.OpCode, p []byte) bool {
	if op != ws.OpClose {
		m.take()
		return m.close == 0
	}
	code, reason := ws.ParseCloseFrameData(p)
	switch {
	case len(p) == 0:
		code = ws.StatusNormalClosure
	case len(p) == 1 || code > maxCloseCode || ws.CheckCloseFrameData(code, reason) != nil:
		code = ws.StatusProtocolError
	}
	m.close = code
	return false
}

// FuzzFrames sends sequences of frames built from arbitrary bytes
// (fuzzFrames) on a real socket to a real gateway, each on a new socket
// and followed by a probe, a subscribe: control frames between fragments,
// empty fragments, floods of pongs, pings or anything, and whatever the
// frames hold. The gateway must close the socket with the code frameModel
// works out, or keep it open and serve the probe as the model says; send
// exactly the rate_limited errors the model counts; and leave another
// user's status record untouched.
func FuzzFrames(f *testing.F) {
	// A frame's head byte: op (index into fuzzOps), final, repeated.
	const (
		text, cont, ping, pong, closeOp, binary = 0, 1, 2, 3, 4, 5
		fin                                     = 0x08
		unmasked                                = 0x10
		x8, x64, x1024                          = 1 << 6, 2 << 6, 3 << 6
	)
	fr := func(head byte, payload string) []byte { return append([]byte{head, byte(len(payload))}, payload...) }
	join := func(frames ...[]byte) []byte { return bytes.Join(frames, nil) }
	hb := `{"type":"heartbeat"}`
	for _, seed := range [][]byte{
		{},
		fr(text|fin, hb),
		fr(pong|fin|x1024, ""), // a pong flood
		join(fr(text, `{"type":`), fr(cont|x1024, "")),     // empty fragments, never ended
		join(fr(text, `{"type":`), fr(pong|fin|x1024, "")), // pongs between fragments
		join(fr(text, `{"type":`), fr(ping|fin, "p"), fr(cont|fin, `"heartbeat"}`)),
		join(fr(text, `{"type":"sub`), fr(cont, ""), fr(cont|fin, `scribe"}`)),
		fr(ping|fin|x8, "p"),                        // the burst, then the probe refused
		join(fr(pong|fin|x8, ""), fr(ping|fin, "")), // refused, and strikes
		join(fr(text, "{"), fr(cont|fin|x8, "}")),   // a new message in a fragmented one
		fr(text|fin, `{"type":"auth","token":"x"}`),
		fr(text|fin, `{"type":"subscribe","id":"s","user_ids":["friend","nobody"]}`),
		fr(closeOp|fin, "\x03\xe8bye"),
		fr(closeOp|fin, "\x03"),
		fr(closeOp|fin, ""),
		fr(binary|fin, "x"),
		fr(text|fin|unmasked, hb),
		fr(0x20|text|fin, hb), // a reserved bit
		fr(6|fin, "x"),        // a reserved op code
		fr(ping, "p"),         // a fragmented ping
		fr(text|fin, "\xff"),
		join(fr(text, string(bytes.Repeat([]byte("m"), 255))), fr(cont|fin, "m")), // over 256 bytes
	} {
		f.Add(seed)
	}
	g := startFuzzGateway(f, Config{
		RateLimit:       1e-6,
		RateBurst:       fuzzFramesBurst,
		RateStrikes:     fuzzFramesStrikes,
		MaxMessageSize:  fuzzFramesMaxMsg,
		MaxConnsPerUser: 1000,
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		g.n++
		probeID := fmt.Sprintf("probe-%d", g.n)
		probe, err := json.Marshal(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: probeID, UserIDs: []string{"fuzzer"}})
		if err != nil {
			t.Fatal(err)
		}
		wire := append(fuzzFrames(data), fuzzFrames(append([]byte{fin, byte(len(probe))}, probe...))...)
		m := &frameModel{burst: fuzzFramesBurst, strikes: fuzzFramesStrikes, probe: probe}
		var d socket.Decoder
		var fe *socket.FrameError
		if err := d.Decode(bytes.Clone(wire), fuzzFramesMaxMsg, m); errors.As(err, &fe) && m.close == 0 {
			m.close = fe.Code
		}
		if m.close == 0 && !m.served && m.errors() == 0 {
			t.Fatalf("%q: the model neither serves nor refuses the probe", data)
		}

		c, err := client.Dial(context.Background(), g.url+"?user=fuzzer", client.Options{})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer func() { _ = c.Abort() }()
		if err := c.WriteBytes(wire); err != nil {
			t.Fatalf("send: %v", err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		limited := 0
		for range 10_000 {
			msg, raw, err := c.Read()
			if err != nil {
				var ce *client.CloseError
				if !errors.As(err, &ce) || ce.Code != m.close {
					t.Fatalf("%q: %v (%s), want close %d after %d rate_limited errors (%d seen)", data, err, raw, m.close, m.errors(), limited)
				}
				break
			}
			if msg.Type == protocol.TypeError && msg.Code == protocol.CodeRateLimited && strings.HasPrefix(msg.Message, "too many frames") {
				limited++
			}
			if m.close == 0 && (m.served && msg.Type == protocol.TypePresenceInit && msg.ID == probeID || !m.served && limited == m.errors()) {
				break
			}
		}
		if limited != m.errors() {
			t.Fatalf("%q: %d rate_limited errors, want %d", data, limited, m.errors())
		}
		g.checkBystander(t, data)
	})
}
