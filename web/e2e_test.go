package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
	"github.com/greendot/greendot/web"
)

// demoURL returns the demo page's URL on base, as user, with extra query
// parameters (which win over fastPage's: the page reads the first of each).
func demoURL(base, user string, extra ...string) string {
	return base + "/?user=" + user + "&" + strings.Join(append(extra, fastPage), "&")
}

// follow follows someone through the page's form, as a person would: type
// the id, press the button (the "and have them follow me back" box is
// checked by default).
func (p *page) follow(user string) {
	p.t.Helper()
	p.do("follow "+user,
		chromedp.SendKeys(chromedp.ID("follow-input"), user),
		chromedp.Click(chromedp.CSS("#follow-form button[type=submit]")))
}

// choose picks a status from the page's status menu: it selects the
// option and fires change, as the browser does when a person picks one.
// (Typing a letter on the focused menu works once, but the browser's
// type-ahead joins letters typed within a second into one search.)
func (p *page) choose(status string) {
	p.t.Helper()
	p.do("choose "+status,
		chromedp.SetValue(chromedp.ID("status-select"), status),
		chromedp.Evaluate[chromedp.Void](`document.querySelector("#status-select").dispatchEvent(new Event("change", {bubbles: true}))`))
	p.wait("status menu on "+status, fmt.Sprintf(`document.querySelector("#status-select").value === %q`, status))
}

func (p *page) connID() string {
	p.t.Helper()
	id, err := eval[string](p, `window.demo.client.hello?.conn_id ?? ""`)
	if err != nil {
		p.t.Fatalf("%s: connection id: %v", p.name, err)
	}
	return id
}

// TestBrowserTwoUsers: two people in two browsers follow each other
// through the demo page and see each other go online, busy, invisible
// (offline to the other) and offline, live.
func TestBrowserTwoUsers(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	gw := sys.Gateway()
	c := startChrome(t, chromium)

	// alice's page reads the graph only after her own changes (no polling
	// within the test), so what she follows must show at once.
	alice := c.open("alice", demoURL(gw.HTTP, "alice", "graph_poll_ms=600000"))
	alice.waitSelf("online")
	if got := alice.text("#me-devices"); got != "(1 device)" {
		t.Errorf("alice's device count: %q", got)
	}
	bob := c.open("bob", demoURL(gw.HTTP, "bob"))
	bob.waitSelf("online")

	// alice follows bob, and bob follows back through the demo shortcut.
	alice.follow("bob")
	alice.waitDot("bob", "online")
	// bob's page finds the new follower in the graph and watches alice.
	bob.waitDot("alice", "online")

	// Three more people, so that every colour is on alice's page: carol
	// was here and left, dave is away, erin is busy.
	carol := sys.Dial(gw, "carol", "phone")
	dave := sys.Dial(gw, "dave")
	stopDave := systest.KeepAlive(dave, browserHeartbeat)
	defer stopDave()
	erin := sys.Dial(gw, "erin")
	stopErin := systest.KeepAlive(erin, browserHeartbeat)
	defer stopErin()
	if err := dave.SetStatus("away"); err != nil {
		t.Fatal(err)
	}
	if err := erin.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	if err := carol.Close(); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"carol", "dave", "erin"} {
		alice.follow(u)
	}
	alice.waitDot("dave", "away")
	alice.waitDot("erin", "busy")
	alice.waitDot("carol", "offline")
	alice.wait("carol's last seen", `document.querySelector('#following li[data-user="carol"] .last-seen').textContent.startsWith("last seen ")`)

	if os.Getenv("GREENDOT_SCREENSHOT") == "1" {
		screenshot(t, alice, filepath.Join("..", "docs", "demo.png"))
	}

	bob.choose("busy")
	bob.waitSelf("busy")
	alice.waitDot("bob", "busy")

	bob.choose("invisible")
	alice.waitDot("bob", "offline")
	bob.wait("bob sees himself invisible", `document.querySelector("#me-status-text").textContent.startsWith("invisible")`)

	bob.choose("online")
	alice.waitDot("bob", "online")
	bob.waitSelf("online")

	// bob closes his tab: after the offline grace alice sees him offline,
	// with when he was last seen (he follows her, so she is a contact).
	bob.close()
	alice.waitDot("bob", "offline")
	alice.wait("bob's last seen", `document.querySelector('#following li[data-user="bob"] .last-seen').textContent.startsWith("last seen ")`)
	if st, err := sys.StatusOf("bob"); err != nil || st.Public != "offline" {
		t.Errorf("bob's record: %+v, %v", st, err)
	}
}

// screenshot writes a PNG of the page to path.
func screenshot(t *testing.T, p *page, path string) {
	t.Helper()
	p.do("size the page", chromedp.EmulateViewport(880, 700))
	// Let the page lay out at its new size before the picture.
	p.wait("layout", `document.readyState === "complete" && window.innerWidth === 880`)
	png, err := evalScreenshot(p)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes)", path, len(png))
}

func evalScreenshot(p *page) ([]byte, error) {
	ctx, cancel := context.WithTimeout(p.ctx, pageWait)
	defer cancel()
	return chromedp.Run(ctx, chromedp.FullScreenshot(100))
}

// TestBrowserHiddenTab: a tab hidden for a while makes its user away, then
// offline, and back online when it is visible again.
func TestBrowserHiddenTab(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	c := startChrome(t, chromium)

	alice := c.open("alice", demoURL(gw.HTTP, "alice", "idle_after_ms=500", "close_after_ms=3000"))
	bob := c.open("bob", demoURL(gw.HTTP, "bob"))
	bob.waitDot("alice", "online")
	alice.waitDot("bob", "online")

	// Hidden for a moment: away; visible again: online at once.
	alice.setWindow(browser.WindowStateMinimized)
	alice.wait("alice's tab is hidden", `document.visibilityState === "hidden"`)
	bob.waitDot("alice", "away")
	conn := alice.connID()
	alice.setWindow(browser.WindowStateNormal)
	bob.waitDot("alice", "online")
	if got := alice.connID(); got != conn {
		t.Errorf("alice reconnected (%s, then %s) where activity on the same connection was enough", conn, got)
	}

	// Hidden for longer: away, then offline.
	alice.setWindow(browser.WindowStateMinimized)
	alice.wait("alice's tab is hidden", `document.visibilityState === "hidden"`)
	bob.waitDot("alice", "away")
	alice.wait("alice still connected while away", `window.demo.client.state === "open"`)

	bob.waitDot("alice", "offline")
	alice.wait("alice's socket closed while hidden", `window.demo.client.state === "suspended"`)

	alice.setWindow(browser.WindowStateNormal)
	alice.wait("alice's tab is visible", `document.visibilityState === "visible"`)
	alice.wait("alice reconnected", `window.demo.client.state === "open"`)
	bob.waitDot("alice", "online")
	alice.waitDot("bob", "online")
}

// TestBrowserReconnect: connections killed by the network, and a gateway
// replaced by another (the old one draining with 1001), both reconnect,
// and the dots recover, chosen status included.
func TestBrowserReconnect(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	sys.Mutual("alice", "bob")
	px := startProxy(t, sys.Gateway().Addr)
	c := startChrome(t, chromium)

	alice := c.open("alice", demoURL(px.URL(), "alice"))
	bob := c.open("bob", demoURL(px.URL(), "bob"))
	alice.waitDot("bob", "online")
	alice.choose("busy")
	bob.waitDot("alice", "busy")

	// The network drops every connection at once.
	a1, b1 := alice.connID(), bob.connID()
	if n := px.Reset(); n < 2 {
		t.Fatalf("killed %d connections, want at least the two sockets", n)
	}
	for _, p := range []*page{alice, bob} {
		p.wait("reconnecting after a reset", `window.demo.states.some((s) => s.state === "reconnecting" && s.code === 1006)`)
	}
	alice.wait("alice on a new connection", fmt.Sprintf(`window.demo.client.state === "open" && window.demo.client.hello.conn_id !== %q`, a1))
	bob.wait("bob on a new connection", fmt.Sprintf(`window.demo.client.state === "open" && window.demo.client.hello.conn_id !== %q`, b1))
	bob.waitDot("alice", "busy")
	alice.waitDot("bob", "online")
	alice.waitSelf("busy")

	// A new gateway takes over; the old one drains.
	old := sys.Gateway()
	g2 := sys.StartGateway(sys.cfg)
	px.SetTarget(g2.Addr)
	a2, b2 := alice.connID(), bob.connID()
	sys.StopGateway(old)
	for _, p := range []*page{alice, bob} {
		p.wait("reconnecting after a drain", `window.demo.states.some((s) => s.state === "reconnecting" && s.code === 1001 && s.delay < 300)`)
	}
	alice.wait("alice on the new gateway", fmt.Sprintf(`window.demo.client.state === "open" && window.demo.client.hello.conn_id !== %q`, a2))
	bob.wait("bob on the new gateway", fmt.Sprintf(`window.demo.client.state === "open" && window.demo.client.hello.conn_id !== %q`, b2))
	natstest.CheckFor(t, pageWait, 20*time.Millisecond, func() error {
		if n := g2.Conns(); n != 2 {
			return fmt.Errorf("the new gateway holds %d sockets, want 2", n)
		}
		return nil
	})
	bob.waitDot("alice", "busy")
	alice.waitDot("bob", "online")
}

// TestClientInBrowser runs greendot.js's unit tests (testdata/client_test.js)
// in a real page: backoff bounds, the activity throttle, message chunking,
// argument checks, reconnect and restore against a scripted socket, and a
// few exchanges with the real gateway that serves the page.
func TestClientInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	sys.Mutual("unit-me", "unit-friend")
	c := startChrome(t, chromium)
	p := c.open("unit", sys.Gateway().HTTP+"/")

	src, err := os.ReadFile(filepath.Join("testdata", "client_test.js"))
	if err != nil {
		t.Fatal(err)
	}
	expr := fmt.Sprintf(`(async () => {
		const m = await import(%q);
		return await (%s)(m, ["unit-me", "unit-friend"]);
	})()`, web.ScriptPath, src)
	type result struct {
		Passed   int      `json:"passed"`
		Failures []string `json:"failures"`
	}
	res, err := evalWithin[result](p, 60*time.Second, expr)
	if err != nil {
		t.Fatalf("run client_test.js: %v\n%s", err, p.diagnostics())
	}
	for _, f := range res.Failures {
		t.Errorf("client_test.js: %s", f)
	}
	if res.Passed < 130 {
		t.Errorf("client_test.js passed %d checks, want at least 130: were checks lost?", res.Passed)
	}
	t.Logf("client_test.js: %d checks passed, %d failed", res.Passed, len(res.Failures))

	// The declarations declare what the module exports, no more, no less.
	exports, err := eval[[]string](p, fmt.Sprintf(`import(%q).then((m) => Object.keys(m).sort())`, web.ScriptPath))
	if err != nil {
		t.Fatal(err)
	}
	dts, err := os.ReadFile("greendot.d.ts")
	if err != nil {
		t.Fatal(err)
	}
	var declared []string
	for _, m := range regexp.MustCompile(`(?m)^export declare (?:class|function|const) (\w+)`).FindAllSubmatch(dts, -1) {
		declared = append(declared, string(m[1]))
	}
	slices.Sort(declared)
	if !slices.Equal(exports, declared) {
		e, _ := json.Marshal(exports)
		d, _ := json.Marshal(declared)
		t.Errorf("greendot.js exports %s, greendot.d.ts declares %s", e, d)
	}
}

// TestBrowserDemoRefused: a connection the gateway closes for good (here
// with 1008, for exceeding the message rate limit again and again) leaves
// the demo page saying so, with the close code and reason and what to do;
// typing in the lobby's box then throws nothing.
func TestBrowserDemoRefused(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	c := startChrome(t, chromium)
	alice := c.open("alice", demoURL(sys.Gateway().HTTP, "alice"))
	alice.wait("alice in the lobby", `window.demo.client.state === "open" && window.demo.lobby.state === "joined"`)

	if _, err := eval[bool](alice, `(() => { for (let i = 0; i < 80; i++) window.demo.client.send({type: "heartbeat"}); return true; })()`); err != nil {
		t.Fatal(err)
	}
	alice.wait("the page says the gateway closed the connection for good", `(() => {
		const s = document.querySelector("#conn-state").textContent;
		return window.demo.client.state === "closed" && s.includes("1008") && s.includes("rate limit exceeded") && s.includes("reload");
	})()`)
	alice.do("type in the lobby's box", chromedp.SendKeys(chromedp.ID("lobby-input"), "hello"))
	if got, err := eval[string](alice, `document.querySelector("#lobby-input").value`); err != nil || got != "hello" {
		t.Fatalf("the lobby's box holds %q (%v)", got, err)
	}
	alice.close()
}

// TestBrowserPhoneBackground: a phone's demo page (background_on_hide=1)
// that goes to the background shows its user away at once, and stays so,
// never offline, when its socket is closed while hidden; shown again, it
// is online.
func TestBrowserPhoneBackground(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	gw := sys.Gateway()
	sys.Mutual("alice", "bob")
	c := startChrome(t, chromium)

	alice := c.open("alice", demoURL(gw.HTTP, "alice", "platform=mobile", "background_on_hide=1", "close_after_ms=1500"))
	bob := c.open("bob", demoURL(gw.HTTP, "bob"))
	bob.waitDot("alice", "online")
	if _, err := eval[bool](bob, `(() => {
		window.aliceSeen = [];
		window.demo.client.onChange((u, p) => { if (u === "alice") window.aliceSeen.push(p.status); });
		return true;
	})()`); err != nil {
		t.Fatal(err)
	}

	alice.setWindow(browser.WindowStateMinimized)
	alice.wait("alice's tab is hidden", `document.visibilityState === "hidden"`)
	bob.waitDot("alice", "away")
	alice.wait("alice's socket closed while hidden", `window.demo.client.state === "suspended"`)
	// Closed, her connection lives out the background grace (2 minutes).
	deadline := time.Now().Add(pageWait)
	for {
		rec, err := sys.StatusOf("alice")
		if err != nil {
			t.Fatal(err)
		}
		closing := 0
		for _, ci := range rec.Conns {
			if ci.Closing && ci.Background {
				closing++
			}
		}
		if closing == 1 && rec.Status == presence.Away {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's record after her hidden socket closed: %+v, want away with a connection closing in the background", rec)
		}
		time.Sleep(20 * time.Millisecond) // polling the record, bounded by deadline
	}
	bob.waitDot("alice", "away")

	alice.setWindow(browser.WindowStateNormal)
	alice.wait("alice reconnected", `window.demo.client.state === "open"`)
	bob.waitDot("alice", "online")
	seen, err := eval[[]string](bob, `window.aliceSeen`)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(seen, "offline") {
		t.Errorf("bob saw alice %v, want no offline", seen)
	}
}
