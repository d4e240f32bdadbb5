package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

func TestAttackFrames(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want []byte
	}{
		{"empty masked pong", frame(ws.OpPong, true, nil), []byte{0x8a, 0x80, 0, 0, 0, 0}},
		{"empty continuation, not final", frame(ws.OpContinuation, false, nil), []byte{0x00, 0x80, 0, 0, 0, 0}},
		{"text, not final", frame(ws.OpText, false, []byte("{")), []byte{0x01, 0x81, 0, 0, 0, 0, '{'}},
		{"pongs at once", repeatFrame(frame(ws.OpPong, true, nil), 2), []byte{0x8a, 0x80, 0, 0, 0, 0, 0x8a, 0x80, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !bytes.Equal(tt.got, tt.want) {
				t.Errorf("got % x, want % x", tt.got, tt.want)
			}
		})
	}
}

func TestJSONBombs(t *testing.T) {
	h, err := ws.ReadHeader(bytes.NewReader(bomb))
	if err != nil {
		t.Fatal(err)
	}
	if !h.Fin || h.OpCode != ws.OpText || !h.Masked || h.Length != 1<<20 || int64(len(bomb)) != h.Length+14 {
		t.Errorf("bomb header %+v, frame of %d bytes: want a masked final text frame of 1 MiB", h, len(bomb))
	}
	deep := nestedJSON(2047)
	if len(deep) != 4094 || !json.Valid(deep) {
		t.Errorf("nested JSON of %d bytes (valid %v): want 4094 bytes of valid JSON", len(deep), json.Valid(deep))
	}
}

func TestAttackRequests(t *testing.T) {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(upgradeRequest("127.0.0.1:1", "u", wsKey, "Origin: https://a.example\r\nOrigin: https://b.example\r\n"))))
	if err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Values("Origin"); len(got) != 2 || req.Header.Get("Sec-WebSocket-Key") != wsKey || req.URL.Query().Get("user") != "u" {
		t.Errorf("upgrade: origins %q, header %v", got, req.Header)
	}
	smuggle := string(smuggleRequests("h"))
	head, _, _ := strings.Cut(smuggle, "\r\n\r\n")
	for _, want := range []string{"POST /api/presence/query", "Content-Length: 6", "Transfer-Encoding: chunked"} {
		if !strings.Contains(head, want) {
			t.Errorf("smuggling request head %q lacks %q", head, want)
		}
	}
	if n := strings.Count(smuggle, " HTTP/1.1\r\n"); n != 3 {
		t.Errorf("smuggling requests: %d request lines, want 3", n)
	}
}

func TestHostilePhases(t *testing.T) {
	phases := hostilePhases()
	if len(phases) != len(attacks)+1 || phases[0] != phaseBaseline {
		t.Fatalf("phases %q: want the baseline, then one per attack", phases)
	}
	seen := map[string]bool{}
	for _, p := range phases {
		if seen[p] || strings.Contains(p, ":") {
			t.Errorf("phase %q: names must be unique and hold no colon", p)
		}
		seen[p] = true
	}
	sources := map[string]bool{}
	for p := 1; p <= len(attacks); p++ {
		for n := range attacks[p-1].workers {
			ip := attackSource(p, n)
			if !ip.IsLoopback() || ip.String() == "127.0.0.1" || sources[ip.String()] {
				t.Errorf("attacker %d of phase %d dials from %v: want a loopback address of its own", n, p, ip)
			}
			sources[ip.String()] = true
		}
	}
}

func TestAnswerName(t *testing.T) {
	for in, want := range map[string]string{
		"close 1008":   "closed with 1008",
		"status 400":   "answered 400",
		"rate_limited": "rate_limited errors",
	} {
		if got := answerName(in); got != want {
			t.Errorf("answerName(%q) = %q, want %q", in, got, want)
		}
	}
	var tally attackTally
	tally.answer("status 400")
	tally.answer("close 1009")
	tally.answer("status 400")
	if got := tally.answerList(); len(got) != 2 || got[0] != "close 1009" || tally.answers["status 400"] != 2 {
		t.Errorf("answers %v (%v)", got, tally.answers)
	}
}

func TestHostileDefaults(t *testing.T) {
	c, err := Config{Scenario: ScenarioHostile, Conns: 20, InProcessWorkers: true}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Targets != 10 || c.Watchers != 10 || c.Follows != 1 || c.Rate != 20 {
		t.Errorf("targets %d, watchers %d, follows %d, rate %g: want 10 pairs at 20 changes/s", c.Targets, c.Watchers, c.Follows, c.Rate)
	}
	c.run = "b"
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	c.Duration = maxCommandTime / 2
	if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("phases of %v: Validate = %v, want ErrInvalidConfig", c.Duration, err)
	}
	c.Duration = 10 * time.Second
	if err := c.Validate(); err != nil {
		t.Errorf("phases of %v: Validate: %v", c.Duration, err)
	}
}
