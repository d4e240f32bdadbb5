package bench

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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
)

// An attack is one phase of the hostile scenario: a kind of abuse from
// raw sockets, run against one gateway while bystanders watch each other.
type attack struct {
	// name names the phase in the report.
	name string
	// workers is how many attacker goroutines run it at once.
	workers int
	// run is one attacker's loop: it dials, abuses, and dials again when
	// the gateway closes it, until ctx is done or it has run its course.
	run func(ctx context.Context, a *attacker)
}

// Attacks bound their own loops: none runs more rounds than this, nor
// past its phase's window.
const maxAttackRounds = 1 << 20

// attacks are the phases of the hostile scenario after the baseline, in
// order.
var attacks = []attack{
	{name: "pong flood", workers: 4, run: pongFlood},
	{name: "pongs inside a fragmented message", workers: 4, run: fragmentedPongs},
	{name: "empty continuation flood", workers: 4, run: continuationFlood},
	{name: "1 MiB JSON bombs", workers: 4, run: jsonBombs},
	{name: "slowloris", workers: 1, run: slowloris},
	{name: "idle TCP connections", workers: 1, run: idleFlood},
	{name: "request smuggling", workers: 4, run: smuggling},
	{name: "malformed upgrades", workers: 4, run: badUpgrades},
	{name: "message flood over the rate limit", workers: 4, run: messageFlood},
}

// phaseBaseline names the phase with no attack.
const phaseBaseline = "baseline"

// hostilePhases returns the names of the scenario's phases, in order.
func hostilePhases() []string {
	out := []string{phaseBaseline}
	for _, a := range attacks {
		out = append(out, a.name)
	}
	return out
}

// attackTally counts what an attack sent and how the gateway answered.
// It is safe for concurrent use.
type attackTally struct {
	sent    atomic.Int64 // frames, requests or bytes written, as the attack counts them
	dials   atomic.Int64 // TCP connections made
	dialErr atomic.Int64 // dials that failed
	closed  atomic.Int64 // connections the gateway closed or reset

	mu      sync.Mutex
	answers map[string]int64 // "close 1008", "status 400", ...
	dialEx  string           // the first failed dial's error
}

// answer counts one answer of the gateway.
func (t *attackTally) answer(what string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.answers == nil {
		t.answers = map[string]int64{}
	}
	t.answers[what]++
}

// answerList returns the answers, sorted by name.
func (t *attackTally) answerList() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.answers))
	for k := range t.answers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// attacker is one goroutine of an attack.
type attacker struct {
	n     int      // its number within the attack
	addr  string   // the gateway, host:port
	local net.Addr // the source address it dials from
	tally *attackTally
}

// dial opens a TCP connection to the gateway, deadline bounding every
// read and write on it. A dial that fails before the window ends is
// counted: most are SYNs the gateway's full accept queue dropped.
func (a *attacker) dial(ctx context.Context, deadline time.Time) (net.Conn, error) {
	d := net.Dialer{LocalAddr: a.local, Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", a.addr)
	if err != nil && (ctx.Err() != nil || !time.Now().Before(deadline)) {
		return nil, err // the window's end, not the gateway
	}
	if err != nil {
		if a.tally.dialErr.Add(1) == 1 {
			a.tally.mu.Lock()
			a.tally.dialEx = err.Error()
			a.tally.mu.Unlock()
		}
		return nil, err
	}
	a.tally.dials.Add(1)
	_ = c.SetDeadline(deadline)
	return c, nil
}

// wsKey is a well-formed Sec-WebSocket-Key (RFC 6455's example).
const wsKey = "dGhlIHNhbXBsZSBub25jZQ=="

// upgradeRequest returns the head of a WebSocket upgrade of user to host,
// with extra header lines (each ending in CRLF) and the given key.
func upgradeRequest(host, user, key, extra string) []byte {
	return []byte("GET /ws?user=" + user + " HTTP/1.1\r\nHost: " + host +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " +
		key + "\r\n" + extra + "\r\n")
}

// upgrade dials and upgrades a socket for user. It returns the connection
// and a reader positioned at the first frame, or nil when the gateway
// refused (counted).
func (a *attacker) upgrade(ctx context.Context, deadline time.Time, user string) (net.Conn, *bufio.Reader) {
	c, err := a.dial(ctx, deadline)
	if err != nil {
		return nil, nil
	}
	if _, err := c.Write(upgradeRequest(a.addr, user, wsKey, "")); err != nil {
		a.lost(c, err)
		return nil, nil
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		a.lost(c, err)
		return nil, nil
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		a.tally.answer("status " + strconv.Itoa(resp.StatusCode))
		_ = c.Close()
		return nil, nil
	}
	return c, br
}

// lost closes c after err ended it, counting the gateway's close.
func (a *attacker) lost(c net.Conn, err error) {
	_ = c.Close()
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		a.tally.closed.Add(1)
	}
}

// isTimeout reports whether err is a deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// drain reads the frames the gateway sends on a socket until it closes,
// counting its close code and its rate_limited errors, then closes c. It
// returns when the socket is closed: the attacker's writes then fail.
func (a *attacker) drain(c net.Conn, br *bufio.Reader) {
	defer func() { _ = c.Close() }()
	for range maxAttackRounds {
		h, err := ws.ReadHeader(br)
		if err != nil {
			a.lost(c, err)
			return
		}
		payload := make([]byte, min(h.Length, 1<<16))
		if _, err := io.ReadFull(br, payload); err != nil {
			a.lost(c, err)
			return
		}
		if _, err := br.Discard(int(h.Length) - len(payload)); err != nil {
			a.lost(c, err)
			return
		}
		switch {
		case h.OpCode == ws.OpClose:
			code := "none"
			if len(payload) >= 2 {
				code = strconv.Itoa(int(binary.BigEndian.Uint16(payload)))
			}
			a.tally.answer("close " + code)
			a.tally.closed.Add(1)
			return
		case h.OpCode == ws.OpText && bytes.Contains(payload, []byte(`"rate_limited"`)):
			a.tally.answer("rate_limited")
		}
	}
}

// frame returns a masked client frame (with a zero mask key, so the
// payload goes as it is).
func frame(op ws.OpCode, fin bool, payload []byte) []byte {
	var b bytes.Buffer
	_ = ws.WriteHeader(&b, ws.Header{Fin: fin, OpCode: op, Masked: true, Length: int64(len(payload))})
	b.Write(payload)
	return b.Bytes()
}

// repeatFrame returns n copies of f, to be written at once.
func repeatFrame(f []byte, n int) []byte { return bytes.Repeat(f, n) }

// nestedJSON returns arrays nested depth deep: [[[...]]].
func nestedJSON(depth int) []byte {
	return append(bytes.Repeat([]byte{'['}, depth), bytes.Repeat([]byte{']'}, depth)...)
}

// floodSocket upgrades a socket, writes head once, then writes body over
// and over until the gateway closes it or deadline passes, counting
// perWrite frames a write; and dials again, for the attack's rounds.
func (a *attacker) floodSocket(ctx context.Context, deadline time.Time, head, body []byte, perWrite int) {
	for round := 0; round < maxAttackRounds && ctx.Err() == nil && time.Now().Before(deadline); round++ {
		c, br := a.upgrade(ctx, deadline, fmt.Sprintf("attacker%d", a.n))
		if c == nil {
			continue
		}
		done := make(chan struct{})
		go func() { defer close(done); a.drain(c, br) }()
		if head != nil {
			if _, err := c.Write(head); err != nil {
				<-done
				continue
			}
			a.tally.sent.Add(1)
		}
		for range maxAttackRounds {
			if ctx.Err() != nil {
				_ = c.Close()
				break
			}
			if _, err := c.Write(body); err != nil {
				break
			}
			a.tally.sent.Add(int64(perWrite))
		}
		<-done
	}
}

// phaseDeadline returns when ctx ends, or in a minute.
func phaseDeadline(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(time.Minute)
}

// pongFlood sends unsolicited empty masked pongs (8a 80 00 00 00 00),
// 64 a write.
func pongFlood(ctx context.Context, a *attacker) {
	a.floodSocket(ctx, phaseDeadline(ctx), nil, repeatFrame(frame(ws.OpPong, true, nil), 64), 64)
}

// fragmentedPongs opens a text message it never finishes, then sends
// pongs inside it, 64 a write.
func fragmentedPongs(ctx context.Context, a *attacker) {
	a.floodSocket(ctx, phaseDeadline(ctx), frame(ws.OpText, false, []byte(`{"type":`)),
		repeatFrame(frame(ws.OpPong, true, nil), 64), 64)
}

// continuationFlood opens a text message and sends empty continuation
// frames that never finish it, 64 a write.
func continuationFlood(ctx context.Context, a *attacker) {
	a.floodSocket(ctx, phaseDeadline(ctx), frame(ws.OpText, false, []byte(`{"type":`)),
		repeatFrame(frame(ws.OpContinuation, false, nil), 64), 64)
}

// bomb is a 1 MiB JSON text frame: far over any --max-message-size.
var bomb = frame(ws.OpText, true, nestedJSON(1<<19))

// jsonBombs sends 1 MiB JSON frames (even attackers) or JSON nested
// 2,047 deep, just under the default 4 KiB message size (odd ones).
func jsonBombs(ctx context.Context, a *attacker) {
	body := bomb
	if a.n%2 == 1 {
		body = frame(ws.OpText, true, nestedJSON(2047))
	}
	a.floodSocket(ctx, phaseDeadline(ctx), nil, body, 1)
}

// messageFlood sends valid JSON messages far over the rate limit, 50 a
// write: the gateway answers rate_limited, then closes with 1008.
func messageFlood(ctx context.Context, a *attacker) {
	a.floodSocket(ctx, phaseDeadline(ctx), nil,
		repeatFrame(frame(ws.OpText, true, []byte(`{"type":"heartbeat"}`)), 50), 50)
}

// Slowloris and idle flood shapes.
const (
	slowConns     = 200
	slowByteEvery = 350 * time.Millisecond
	idleConns     = 400
)

// slowloris holds slowConns connections that each trickle an upgrade's
// head a byte every slowByteEvery; a connection the gateway closes is
// dialed again.
func slowloris(ctx context.Context, a *attacker) {
	deadline := phaseDeadline(ctx)
	head := upgradeRequest(a.addr, "slow", wsKey, "")
	type slow struct {
		c   net.Conn
		off int
	}
	conns := make([]slow, slowConns)
	defer func() {
		for _, s := range conns {
			if s.c != nil {
				_ = s.c.Close()
			}
		}
	}()
	tick := time.NewTicker(slowByteEvery)
	defer tick.Stop()
	for round := 0; round < maxAttackRounds && ctx.Err() == nil; round++ {
		for i := range conns {
			s := &conns[i]
			if s.c == nil {
				c, err := a.dial(ctx, deadline)
				if err != nil {
					continue
				}
				s.c, s.off = c, 0
			}
			if _, err := s.c.Write(head[s.off%len(head) : s.off%len(head)+1]); err != nil {
				a.lost(s.c, err)
				s.c = nil
				continue
			}
			a.tally.sent.Add(1)
			s.off++
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// idleFlood holds idleConns connections that send nothing, each dialed
// again when the gateway closes it.
func idleFlood(ctx context.Context, a *attacker) {
	deadline := phaseDeadline(ctx)
	var wg sync.WaitGroup
	for range idleConns {
		wg.Go(func() {
			for round := 0; round < maxAttackRounds && ctx.Err() == nil; round++ {
				c, err := a.dial(ctx, deadline)
				if err != nil {
					return
				}
				stop := context.AfterFunc(ctx, func() { _ = c.Close() })
				_, err = c.Read(make([]byte, 512))
				if stop() {
					a.lost(c, err)
				}
			}
		})
	}
	wg.Wait()
}

// smuggleRequests returns a POST /api/presence/query with both a
// Content-Length and a chunked Transfer-Encoding, whose body hides a
// second request, pipelined with a plain GET.
func smuggleRequests(host string) []byte {
	return []byte("POST /api/presence/query?user=attacker HTTP/1.1\r\nHost: " + host +
		"\r\nContent-Type: application/json\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"0\r\n\r\nGET /api/presence/query HTTP/1.1\r\nHost: " + host + "\r\n\r\n" +
		"GET /readyz HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
}

// smuggling writes smuggleRequests on a connection and reads every
// answer the gateway gives, then dials again.
func smuggling(ctx context.Context, a *attacker) {
	deadline := phaseDeadline(ctx)
	reqs := smuggleRequests(a.addr)
	for round := 0; round < maxAttackRounds && ctx.Err() == nil; round++ {
		a.answerRequests(ctx, deadline, reqs, 3)
	}
}

// answerRequests dials, writes reqs (n requests) and counts the status
// of every response until the gateway closes the connection.
func (a *attacker) answerRequests(ctx context.Context, deadline time.Time, reqs []byte, n int) {
	c, err := a.dial(ctx, deadline)
	if err != nil {
		return
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write(reqs); err != nil {
		a.lost(c, err)
		return
	}
	a.tally.sent.Add(int64(n))
	br := bufio.NewReader(c)
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			a.lost(c, err)
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
		a.tally.answer("status " + strconv.Itoa(resp.StatusCode))
	}
}

// badUpgrades sends upgrades with a malformed Sec-WebSocket-Key (even
// attackers) or two Origin headers (odd ones), one a connection.
func badUpgrades(ctx context.Context, a *attacker) {
	deadline := phaseDeadline(ctx)
	req := upgradeRequest(a.addr, "bad", "not-a-key", "")
	if a.n%2 == 1 {
		req = upgradeRequest(a.addr, "bad", wsKey, "Origin: https://a.example\r\nOrigin: https://b.example\r\n")
	}
	for round := 0; round < maxAttackRounds && ctx.Err() == nil; round++ {
		a.answerRequests(ctx, deadline, req, 1)
	}
}

// runAttack runs the attackers of phase p's attack against addr until ctx
// is done, and returns their tally once every one has returned.
func runAttack(ctx context.Context, p int, att attack, addr string) *attackTally {
	t := &attackTally{}
	var wg sync.WaitGroup
	for n := range att.workers {
		a := &attacker{n: n, addr: addr, local: &net.TCPAddr{IP: attackSource(p, n)}, tally: t}
		wg.Go(func() { att.run(ctx, a) })
	}
	wg.Wait()
	return t
}

// attackSource returns the loopback address attacker n of phase p dials
// from, 127.0.p.n+1 (p from 1), apart from the workers' 127.0.0.x: each
// attacker has an ephemeral port range of its own.
func attackSource(p, n int) net.IP { return net.IPv4(127, 0, byte(p%256), byte(1+n%250)) }

// answerName turns an answer into a figure's words.
func answerName(a string) string {
	switch {
	case a == "rate_limited":
		return "rate_limited errors"
	case strings.HasPrefix(a, "close "):
		return "closed with " + strings.TrimPrefix(a, "close ")
	}
	return "answered " + strings.TrimPrefix(a, "status ")
}
