package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/pkg/protocol"
)

func TestBackoffGrowsAndIsBounded(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: 3 * time.Second}
	want := []time.Duration{100, 200, 400, 800, 1600, 3000, 3000}
	for n, w := range want {
		if got := b.Cap(n); got != w*time.Millisecond && w != 3000 || w == 3000 && got != b.Max {
			t.Errorf("Cap(%d) = %v, want %v", n, got, w*time.Millisecond)
		}
	}
	for _, n := range []int{-1, 0} {
		if got := b.Cap(n); got != b.Base {
			t.Errorf("Cap(%d) = %v, want the base", n, got)
		}
	}
	// No overflow, however many attempts or however large the bounds.
	huge := Backoff{Base: time.Duration(1 << 61), Max: time.Duration(1<<63 - 1)}
	for _, n := range []int{10, 64, 1000, 1 << 30} {
		if got := b.Cap(n); got != b.Max {
			t.Errorf("Cap(%d) = %v, want the max", n, got)
		}
		if got := huge.Cap(n); got != huge.Max {
			t.Errorf("huge Cap(%d) = %v, want the max", n, got)
		}
	}
	// Full jitter: from 0 up to the cap, never the cap itself.
	for n := range 8 {
		if got := b.delay(n, 0); got != 0 {
			t.Errorf("delay(%d, 0) = %v", n, got)
		}
		if got := b.delay(n, 0.5); got != b.Cap(n)/2 {
			t.Errorf("delay(%d, 0.5) = %v, want %v", n, got, b.Cap(n)/2)
		}
		if got := b.delay(n, 0.9999999); got >= b.Cap(n) || got < b.Cap(n)*99/100 {
			t.Errorf("delay(%d, 0.9999999) = %v, want just under %v", n, got, b.Cap(n))
		}
		for range 200 {
			if d := b.Delay(n); d < 0 || d >= b.Cap(n) {
				t.Fatalf("Delay(%d) = %v, out of [0, %v)", n, d, b.Cap(n))
			}
		}
	}
	if got := (Backoff{}).Cap(100); got != DefaultBackoffMax {
		t.Errorf("zero Backoff caps at %v, want %v", got, DefaultBackoffMax)
	}
}

func TestBackoffChecksItsBounds(t *testing.T) {
	for _, b := range []Backoff{{Base: -time.Second}, {Base: time.Second, Max: time.Millisecond}} {
		if _, err := b.withDefaults(); err == nil {
			t.Errorf("%+v accepted", b)
		}
	}
	if b, err := (Backoff{Base: time.Minute}).withDefaults(); err != nil || b.Max != time.Minute {
		t.Errorf("a base over the default max: %+v, %v", b, err)
	}
}

// TestOpenWaitsTheBackoff runs the retry loop against a dialer that always
// fails (a token func that errors), in a bubble of fake time: the waits
// between attempts are the backoff's, and end when the context does.
func TestOpenWaitsTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var at []time.Time
		cfg, err := Config{
			Backoff: Backoff{Base: time.Second, Max: 4 * time.Second},
			TokenFunc: func(context.Context) (string, error) {
				at = append(at, time.Now())
				return "", errors.New("token service down")
			},
		}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		c := &Client{url: "ws://127.0.0.1:1/ws", cfg: cfg}
		var told []Disconnected
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		attempt := 0
		_, err = c.open(ctx, 0, &attempt, func(d Disconnected) { told = append(told, d) })
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "token service down") {
			t.Fatalf("open = %v, want the deadline and the last failure", err)
		}
		if len(at) < 15 {
			t.Fatalf("%d attempts in a minute, want at least 15 with waits under 4s", len(at))
		}
		for i := 1; i < len(at); i++ {
			wait := at[i].Sub(at[i-1])
			if bound := cfg.Backoff.Cap(i - 1); wait > bound {
				t.Errorf("wait %d was %v, over %v", i, wait, bound)
			}
			if told[i-1].Retry != wait || told[i-1].Attempt != i {
				t.Errorf("told %+v before wait %d of %v", told[i-1], i, wait)
			}
		}
	})
}

func TestPermanentRefusals(t *testing.T) {
	plain := &Client{}
	refreshing := &Client{cfg: Config{TokenFunc: func(context.Context) (string, error) { return "t", nil }}}
	tests := []struct {
		err        error
		permanent  bool
		refreshing bool // with a TokenFunc
	}{
		{&HandshakeError{Status: http.StatusUnauthorized}, true, true},
		{&HandshakeError{Status: http.StatusForbidden}, true, true},
		{&HandshakeError{Status: http.StatusBadRequest}, true, true},
		{&HandshakeError{Status: http.StatusTooManyRequests}, false, false},
		{&HandshakeError{Status: http.StatusServiceUnavailable}, false, false},
		{&HandshakeError{Status: http.StatusBadGateway}, false, false},
		{&CloseError{Code: ws.StatusPolicyViolation, Reason: "rate limit exceeded"}, true, true},
		{&CloseError{Code: ws.StatusPolicyViolation, Reason: "token expired"}, true, false},
		{&CloseError{Code: ws.StatusMessageTooBig}, true, true},
		{&CloseError{Code: ws.StatusUnsupportedData}, true, true},
		{&CloseError{Code: ws.StatusProtocolError}, true, true},
		{&CloseError{Code: ws.StatusInvalidFramePayloadData}, true, true},
		{&CloseError{Code: ws.StatusGoingAway}, false, false},
		{&CloseError{Code: ws.StatusNormalClosure}, false, false},
		{&CloseError{Code: ws.StatusInternalServerError}, false, false},
		{&CloseError{Code: ws.StatusCode(protocol.CloseServiceRestart)}, false, false},
		{fmt.Errorf("read: %w", errors.New("connection reset by peer")), false, false},
	}
	for _, tt := range tests {
		if got := plain.permanent(tt.err); got != tt.permanent {
			t.Errorf("permanent(%v) = %v", tt.err, got)
		}
		if got := refreshing.permanent(fmt.Errorf("wrapped: %w", tt.err)); got != tt.refreshing {
			t.Errorf("with a token func, permanent(%v) = %v", tt.err, got)
		}
	}
}

func TestConnectRefusesBadConfig(t *testing.T) {
	tests := []struct {
		name, url string
		cfg       Config
		want      string
	}{
		{"no identity", "ws://127.0.0.1:1/ws", Config{}, "no identity"},
		{"token and user", "ws://127.0.0.1:1/ws", Config{Token: "t", User: "alice"}, "not both"},
		{"bad user", "ws://127.0.0.1:1/ws", Config{User: "al ice"}, `user id "al ice"`},
		{"bad device", "ws://127.0.0.1:1/ws", Config{User: "alice", Device: "ph/one"}, `device "ph/one"`},
		{"bad platform", "ws://127.0.0.1:1/ws", Config{User: "alice", Platform: "tv"}, `platform "tv": want web, desktop or mobile`},
		{"bad backoff", "ws://127.0.0.1:1/ws", Config{User: "alice", Backoff: Backoff{Base: time.Second, Max: time.Millisecond}}, "backoff max"},
		{"negative buffer", "ws://127.0.0.1:1/ws", Config{User: "alice", EventBuffer: -1}, "event buffer"},
		{"negative wait", "ws://127.0.0.1:1/ws", Config{User: "alice", DrainJitter: -1}, "negative"},
		{"bad scheme", "ftp://127.0.0.1:1/ws", Config{User: "alice"}, "scheme"},
		{"no host", "ws:///ws", Config{User: "alice"}, "no host"},
		{"bad url", "ws://[::1", Config{User: "alice"}, "bad url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Connect(context.Background(), tt.url, tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Connect = %v, want an error about %s", err, tt.want)
			}
		})
	}
}

func TestGatewayURL(t *testing.T) {
	tests := []struct {
		raw  string
		cfg  Config
		want string
	}{
		{"http://h:1", Config{User: "alice"}, "ws://h:1/ws?user=alice"},
		{"https://h/", Config{Token: "t", Device: "my phone"}, "wss://h/ws?device=my+phone"},
		{"https://h/", Config{Token: "t", Platform: "mobile"}, "wss://h/ws?platform=mobile"},
		{"ws://h:1/presence/ws?x=1#frag", Config{User: "bob"}, "ws://h:1/presence/ws?user=bob&x=1"},
	}
	for _, tt := range tests {
		got, err := gatewayURL(tt.raw, tt.cfg)
		if err != nil || got != tt.want {
			t.Errorf("gatewayURL(%q) = %q, %v; want %q", tt.raw, got, err, tt.want)
		}
	}
}

// TestChunksFitTheGateway: however many and however long the ids, every
// subscribe message is within the gateway's limits and none is lost.
func TestChunksFitTheGateway(t *testing.T) {
	for _, n := range []int{1, 99, 100, 101, 250, 1000} {
		for _, idLen := range []int{1, 10, 64} {
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("%0*d", idLen, i)[:idLen]
				if idLen < 4 {
					ids[i] = fmt.Sprint(i)
				}
			}
			var total int
			for _, chunk := range chunks(ids, protocol.TypeSubscribe) {
				total += len(chunk)
				data, err := json.Marshal(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: "s-18446744073709551615", UserIDs: chunk})
				if err != nil {
					t.Fatal(err)
				}
				if len(chunk) > MaxSubscribeIDs || len(data) > MaxMessageBytes {
					t.Fatalf("%d ids of %d: a chunk of %d ids, %d bytes", n, idLen, len(chunk), len(data))
				}
			}
			if total != n {
				t.Fatalf("%d ids of %d: %d in the chunks", n, idLen, total)
			}
		}
	}
}

func TestTimingsFollowTheHello(t *testing.T) {
	every, silence := timings(protocol.Hello{HeartbeatIntervalMS: 300, TTLMS: 1000})
	if every != 300*time.Millisecond || silence != 1300*time.Millisecond {
		t.Errorf("timings = %v, %v", every, silence)
	}
	every, silence = timings(protocol.Hello{})
	if every != DefaultHeartbeatInterval || silence != DefaultTTL+DefaultHeartbeatInterval {
		t.Errorf("default timings = %v, %v", every, silence)
	}
	// A TTL under two intervals would leave no room for a ping's pong.
	if _, silence = timings(protocol.Hello{HeartbeatIntervalMS: 1000, TTLMS: 1000}); silence != 3*time.Second {
		t.Errorf("silence = %v, want 3s", silence)
	}
}
