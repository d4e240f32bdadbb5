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
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

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

func startFuzzGateway(f *testing.F) *fuzzGateway {
	srv := natstest.RunServerWithOptions(f, &server.Options{StoreDir: fuzzStoreDir(f)})
	nc := natstest.Connect(f, srv)
	svc, err := New(nc, Config{
		DevAuth:   true,
		ConnTTL:   5 * time.Minute,
		RateLimit: 1e6,
		RateBurst: 1e6,
		// In memory: a fuzzing worker killed in the middle of an input
		// leaves its store for the coordinator to remove (fuzzStoreDir),
		// and nothing of it need outlast the worker.
		Buckets: presence.BucketOptions{Storage: jetstream.MemoryStorage},
	})
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
	g := startFuzzGateway(f)
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
		rec, _, err := g.store.Status(context.Background(), "friend")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(rec.Conns, g.bystander.Conns) || rec.Status != g.bystander.Status {
			t.Fatalf("after %q: the friend's record changed: %+v, was %+v", data, rec, g.bystander)
		}
	})
}
