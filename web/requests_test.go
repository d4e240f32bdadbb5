package web_test

import (
	"fmt"
	"strings"
	"testing"
)

// The tests of this file drive greendot.js in a page against a real
// gateway where the gateway's limits matter: the 16 requests a socket may
// have waiting, the room update rate, the message rate limit and its close
// with 1008. The client is window.gd; window.errs and window.states record
// its error and state events.

// openClient opens a page on the gateway and makes a GreenDot client in it
// as user (extra: more options, as JavaScript), waiting until it is open.
func openClient(t *testing.T, c *chrome, base, user, extra string) *page {
	t.Helper()
	p := c.open(user, base+"/")
	if _, err := eval[bool](p, fmt.Sprintf(`(async () => {
		const m = await import("/greendot.js");
		window.m = m;
		window.states = [];
		window.errs = [];
		const gd = new m.GreenDot({user: %q, trackVisibility: false, backoffBaseMs: 100, backoffMaxMs: 200, %s});
		gd.onState((s, d) => window.states.push({state: s, code: d.code, reason: d.reason}));
		gd.onError((e) => window.errs.push(e.code + (e.id ? "@" + e.id : "") + (e.close_code ? "@" + e.close_code : "")));
		window.gd = gd;
		await new Promise((r) => { const off = gd.onState((s) => { if (s === "open") { off(); r(); } }); });
		return true;
	})()`, user, extra)); err != nil {
		t.Fatalf("start the client: %v\n%s", err, p.diagnostics())
	}
	return p
}

// meOnDemo starts the demo's system, with n users prefix0, prefix1, ...
// mutual followers of me, and a browser, and opens a page with a client
// of user me on it.
func meOnDemo(t *testing.T, prefix string, n int) *page {
	t.Helper()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	mutualWith(sys, "me", prefix, n)
	c := startChrome(t, chromium)
	return openClient(t, c, sys.Gateway().HTTP, "me", "")
}

// expectNoErrors fails the test if the page's client had error events.
func expectNoErrors(t *testing.T, p *page) {
	t.Helper()
	if errs, err := eval[[]string](p, `window.errs`); err != nil || len(errs) > 0 {
		t.Errorf("errors: %v %v", errs, err)
	}
}

// mutualWith makes n users prefix0, prefix1, ... mutual followers of user.
func mutualWith(sys *demoSystem, user, prefix string, n int) {
	for i := range n {
		sys.Mutual(user, fmt.Sprintf("%s%d", prefix, i))
	}
}

// TestBrowserSubscribeOneByOne: an app that subscribes user by user (one
// subscribe call per avatar on the page) while connected makes more
// requests than the gateway lets wait at once, and more messages than its
// message rate limit takes at once; the client keeps them within its
// window and rate and sends the rest as the first are answered, so every
// call resolves and every user's presence arrives, none refused.
func TestBrowserSubscribeOneByOne(t *testing.T) {
	t.Parallel()
	p := meOnDemo(t, "u", 50)
	type result struct {
		Refused []string `json:"refused"`
		Missing []string `json:"missing"`
		Errs    []string `json:"errs"`
	}
	res, err := eval[result](p, `(async () => {
		const ids = Array.from({length: 50}, (_, i) => "u" + i);
		const results = await Promise.allSettled(ids.map((id) => gd.subscribe(id)));
		return {
			refused: ids.filter((id, i) => results[i].status === "rejected"),
			missing: ids.filter((id) => gd.presence(id) === undefined),
			errs: window.errs,
		};
	})()`)
	if err != nil {
		t.Fatalf("50 subscribe calls: %v\n%s", err, p.diagnostics())
	}
	if len(res.Refused) > 0 || len(res.Missing) > 0 || len(res.Errs) > 0 {
		t.Errorf("50 subscribe calls: refused %v, no presence for %v, errors %v; want every one answered", res.Refused, res.Missing, res.Errs)
	}
}

// TestBrowserJoinBehindSubscribes: a room joined while many subscribes
// wait is joined once the gateway takes it: the Room gets its state, and
// typing() sends.
func TestBrowserJoinBehindSubscribes(t *testing.T) {
	t.Parallel()
	p := meOnDemo(t, "x", 30)
	got, err := eval[string](p, `(async () => {
		for (let i = 0; i < 30; i++) gd.subscribe("x" + i);
		const room = gd.room("doc:1", {name: "me"});
		await new Promise((r) => { const off = room.on("sync", () => { off(); r(); }); });
		return room.state + " typing()=" + room.typing() + " errors=" + window.errs.length;
	})()`)
	if err != nil {
		t.Fatalf("join behind 30 subscribes: %v (never joined)\n%s", err, p.diagnostics())
	}
	if got != "joined typing()=true errors=0" {
		t.Errorf("room after its state: %s, want joined typing()=true errors=0", got)
	}
}

// TestBrowserLeaveBehindSubscribes: a room left while many subscribes wait
// is left at the gateway too: the other members see the user go.
func TestBrowserLeaveBehindSubscribes(t *testing.T) {
	t.Parallel()
	p := meOnDemo(t, "x", 30)
	if _, err := eval[bool](p, `(async () => {
		const bob = new m.GreenDot({user: "bob", trackVisibility: false});
		window.bobRoom = bob.room("doc:1", {});
		window.room = gd.room("doc:1", {});
		await new Promise((r) => { const off = room.on("sync", () => { off(); r(); }); });
		return true;
	})()`); err != nil {
		t.Fatal(err)
	}
	p.wait("bob sees me in the room", `window.bobRoom.member("me") !== undefined`)
	if _, err := eval[bool](p, `(() => {
		for (let i = 0; i < 30; i++) gd.subscribe("x" + i);
		room.leave();
		return room.state === "left";
	})()`); err != nil {
		t.Fatal(err)
	}
	p.wait("bob no longer sees me in the room", `window.bobRoom.member("me") === undefined`)
	expectNoErrors(t, p)
}

// TestBrowserRoomMetaBurst: meta updates faster than the gateway's room
// update rate all end with the newest meta at the gateway, and so at every
// member: updates that wait are folded into the newest.
func TestBrowserRoomMetaBurst(t *testing.T) {
	t.Parallel()
	p := meOnDemo(t, "", 0)
	if _, err := eval[bool](p, `(async () => {
		window.room = gd.room("doc:1", {n: -1});
		await new Promise((r) => { const off = room.on("sync", () => { off(); r(); }); });
		for (let i = 0; i < 30; i++) room.updateMeta({n: i});
		return true;
	})()`); err != nil {
		t.Fatal(err)
	}
	p.wait("the gateway has the newest meta", `window.room.member("me")?.conns[0]?.meta?.n === 29`)
	expectNoErrors(t, p)
}

// TestBrowserPolicyCloseIsFinal: a socket closed with 1008 (here: the
// message rate limit exceeded again and again) is not to come back as is
// (docs/integration.md, step 6): the client ends, closed, with an error
// event that gives the close code.
func TestBrowserPolicyCloseIsFinal(t *testing.T) {
	t.Parallel()
	p := meOnDemo(t, "", 0)
	if _, err := eval[bool](p, `(() => { for (let i = 0; i < 80; i++) gd.send({type: "heartbeat"}); return true; })()`); err != nil {
		t.Fatal(err)
	}
	p.wait("the client closed", `gd.state === "closed"`)
	type result struct {
		States    string `json:"states"`
		Refusal   string `json:"refusal"`
		Reconnect bool   `json:"reconnect"`
	}
	res, err := eval[result](p, `(() => ({
		states: window.states.map((s) => s.state + (s.code ? ":" + s.code : "")).join(" "),
		refusal: window.errs.find((e) => e.startsWith("refused")) ?? "",
		reconnect: (() => { try { gd.connect(); return true; } catch { return false; } })(),
	}))()`)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(res.States, "open closed:1008") || strings.Contains(res.States, "reconnecting") {
		t.Errorf("states %q, want to end open, closed:1008, with no reconnecting", res.States)
	}
	if res.Refusal != "refused@1008" {
		t.Errorf("error event %q, want refused with close_code 1008", res.Refusal)
	}
	if res.Reconnect {
		t.Errorf("connect() after the close worked; want it to throw, as after close()")
	}
}

// TestBrowserSetTokenKeepsFunction: setToken renews the live socket's
// token, and the token function stays: every later connection calls it,
// so a renewed token that expires in turn does not lock the client out.
func TestBrowserSetTokenKeepsFunction(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	c := startChrome(t, chromium)
	p := c.open("unit", sys.Gateway().HTTP+"/")
	got, err := eval[string](p, `(async () => {
		const m = await import("/greendot.js");
		const all = [];
		let made = () => {};
		class W {
			constructor(url) { this.url = url; this.readyState = 0; this.sent = []; all.push(this); made(); }
			send(data) { this.sent.push(JSON.parse(data)); }
			close() { this.readyState = 3; }
		}
		// socket resolves with the n-th socket (from 1) once it is made.
		const socket = (n) => new Promise((r) => {
			made = () => { if (all.length >= n) r(all[n - 1]); };
			made();
		});
		let calls = 0;
		const gd = new m.GreenDot({WebSocket: W, url: "ws://h.example", trackVisibility: false, backoffBaseMs: 10, backoffMaxMs: 20,
			token: async () => "fresh" + (++calls)});
		const ws1 = await socket(1);
		ws1.readyState = 1;
		ws1.onmessage({data: JSON.stringify({type: "hello", user_id: "me", conn_id: "c1", heartbeat_interval_ms: 60000, ttl_ms: 120000, status: "online"})});
		gd.setToken("renewed-that-expires");
		const auth = ws1.sent.find((s) => s.type === "auth")?.token;
		ws1.readyState = 3;
		ws1.onclose({code: 1006, reason: ""});
		const ws2 = await socket(2);
		ws2.onclose({code: 1006, reason: ""});
		await socket(3);
		gd.close();
		return "auth=" + auth + " " + all.map((w) => new URL(w.url).searchParams.get("token")).join(",") + " calls=" + calls;
	})()`)
	if err != nil {
		t.Fatal(err)
	}
	if got != "auth=renewed-that-expires fresh1,fresh2,fresh3 calls=3" {
		t.Errorf("tokens: %s, want the renewal on the live socket and the function's token for every connection", got)
	}
}
