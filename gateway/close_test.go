package gateway_test

import (
	"bytes"
	"cmp"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// keepWriting writes heartbeat frames to c, one a millisecond, for d,
// without reading: a client busy sending when the gateway closes it, as a
// client flooding the gateway is. It returns the first write error. A
// gateway that closes its socket with data still unread makes the kernel
// answer with a reset: the client's writes then fail, and a client
// library gives up with 1006 before it reads the close frame and the
// error frames waiting for it.
func keepWriting(c *client.Conn, d time.Duration) error {
	hb := text(`{"type":"heartbeat"}`)
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		<-t.C
		_ = c.NetConn().SetWriteDeadline(time.Now().Add(time.Second))
		if err := c.WriteBytes(hb); err != nil {
			return err
		}
	}
	return nil
}

// TestCloseReachesAClientStillSending: every close the gateway starts
// reaches a client that keeps sending while it is closed, with its code
// and the frames written before it, for each code the gateway sends.
func TestCloseReachesAClientStillSending(t *testing.T) {
	t.Parallel()
	const lenient = 1e6 // messages per second: only the rate limit case hits it
	tests := []struct {
		name string
		cfg  gateway.Config
		// token is the client's token, when not a long one.
		token func(tb testing.TB) string
		// close makes the gateway close the socket.
		close func(t *testing.T, sys *systest.System, g *systest.Gateway, c *client.Conn)
		code  ws.StatusCode
		// limited is how many rate_limited errors must come first.
		limited int
		// writeFor is how long the client keeps writing after close
		// was called; zero means 300ms.
		writeFor time.Duration
	}{{
		name: "rate limit 1008",
		close: func(t *testing.T, _ *systest.System, _ *systest.Gateway, c *client.Conn) {
			// The flood of a client gone wild: 2,000 messages at once.
			if err := c.WriteBytes(bytes.Repeat(text(`{"type":"activity"}`), 2000)); err != nil {
				t.Fatal(err)
			}
		},
		code:    protocol.ClosePolicy,
		limited: gateway.DefaultConfig().RateStrikes,
	}, {
		name: "oversized 1009",
		cfg:  gateway.Config{RateLimit: lenient, RateBurst: 1 << 20},
		close: func(t *testing.T, _ *systest.System, _ *systest.Gateway, c *client.Conn) {
			if err := c.WriteBytes(text(strings.Repeat("x", gateway.DefaultMaxMessageSize+1))); err != nil {
				t.Fatal(err)
			}
		},
		code: protocol.CloseTooBig,
	}, {
		name: "binary 1003",
		cfg:  gateway.Config{RateLimit: lenient, RateBurst: 1 << 20},
		close: func(t *testing.T, _ *systest.System, _ *systest.Gateway, c *client.Conn) {
			if err := c.WriteBytes(handFrame(true, 0, byte(ws.OpBinary), true, -1, []byte("bin"))); err != nil {
				t.Fatal(err)
			}
		},
		code: protocol.CloseUnsupported,
	}, {
		name: "invalid UTF-8 1007",
		cfg:  gateway.Config{RateLimit: lenient, RateBurst: 1 << 20},
		close: func(t *testing.T, _ *systest.System, _ *systest.Gateway, c *client.Conn) {
			if err := c.WriteBytes(text("\xff\xfe")); err != nil {
				t.Fatal(err)
			}
		},
		code: ws.StatusInvalidFramePayloadData,
	}, {
		name: "protocol error 1002",
		cfg:  gateway.Config{RateLimit: lenient, RateBurst: 1 << 20},
		close: func(t *testing.T, _ *systest.System, _ *systest.Gateway, c *client.Conn) {
			if err := c.WriteBytes(handFrame(true, 0, byte(ws.OpText), false, -1, []byte("unmasked"))); err != nil {
				t.Fatal(err)
			}
		},
		code: protocol.CloseProtocolError,
	}, {
		name: "bad token 1008",
		cfg:  gateway.Config{RateLimit: lenient, RateBurst: 1 << 20},
		close: func(t *testing.T, _ *systest.System, _ *systest.Gateway, c *client.Conn) {
			if err := c.Send(protocol.ClientMessage{Type: protocol.TypeAuth, Token: "not.a.token"}); err != nil {
				t.Fatal(err)
			}
		},
		code: protocol.ClosePolicy,
	}, {
		name:     "token expired 1008",
		cfg:      gateway.Config{RateLimit: lenient, RateBurst: 1 << 20, ConnTTL: 30 * time.Second},
		token:    func(tb testing.TB) string { return secToken(tb, "mallory", time.Now().Add(2*time.Second)) },
		close:    func(*testing.T, *systest.System, *systest.Gateway, *client.Conn) {},
		code:     protocol.ClosePolicy,
		writeFor: 3 * time.Second, // the token expires after 2s
	}, {
		name: "kick 1000",
		cfg:  gateway.Config{RateLimit: lenient, RateBurst: 1 << 20},
		close: func(t *testing.T, sys *systest.System, _ *systest.Gateway, _ *client.Conn) {
			if _, err := adminclient.Kick(context.Background(), sys.NC, admin.KickRequest{UserID: "mallory", Code: protocol.CloseNormal, Reason: "bye"}, 0); err != nil {
				t.Fatal(err)
			}
		},
		code: protocol.CloseNormal,
	}, {
		name: "drain 1001",
		cfg:  gateway.Config{RateLimit: lenient, RateBurst: 1 << 20},
		close: func(t *testing.T, sys *systest.System, g *systest.Gateway, _ *client.Conn) {
			go sys.StopGateway(g)
		},
		code: protocol.CloseGoingAway,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sys := secStart(t, systest.Options{})
			g := sys.StartGateway(tt.cfg)
			token := secLongToken(t, "mallory")
			if tt.token != nil {
				token = tt.token(t)
			}
			c, err := secDialErr(g.WS, bearer(token))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Abort() })

			tt.close(t, sys, g, c)
			if err := keepWriting(c, cmp.Or(tt.writeFor, 300*time.Millisecond)); err != nil {
				t.Errorf("a write failed while the gateway closed the socket: %v", err)
			}
			code, seen := awaitClose(t, c, 15*time.Second)
			if code != tt.code {
				t.Errorf("closed with %d, want %d", code, tt.code)
			}
			limited := 0
			for _, m := range seen {
				if m.Type == protocol.TypeError && m.Code == protocol.CodeRateLimited {
					limited++
				}
			}
			if limited != tt.limited {
				t.Errorf("%d rate_limited errors before the close, want %d", limited, tt.limited)
			}
		})
	}
}
