package web_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// waitAvatar waits until the page's lobby shows user's avatar with the
// initial.
func (p *page) waitAvatar(user, initial string) {
	p.t.Helper()
	p.wait(fmt.Sprintf("%s's avatar in the lobby", user), fmt.Sprintf(
		`document.querySelector('#lobby-members li[data-user=%q]')?.textContent === %q`, user, initial))
}

// waitNoAvatar waits until the page's lobby no longer shows user.
func (p *page) waitNoAvatar(user string) {
	p.t.Helper()
	p.wait(fmt.Sprintf("%s gone from the lobby", user), fmt.Sprintf(
		`window.demo.lobby.state === "joined" && !document.querySelector('#lobby-members li[data-user=%q]')`, user))
}

// TestBrowserRoom: two people open the demo, which puts everyone in one
// room, the lobby. Each sees the other's avatar without following anyone;
// a reconnect re-syncs the room without anyone leaving or joining again;
// a closed tab leaves the room after the offline grace.
func TestBrowserRoom(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	gw := sys.Gateway()
	// alice goes through a proxy, to cut her connection; bob does not.
	px := startProxy(t, gw.Addr)
	c := startChrome(t, chromium)

	alice := c.open("alice", demoURL(px.URL(), "alice"))
	bob := c.open("bob", demoURL(gw.HTTP, "bob"))
	alice.waitAvatar("bob", "B")
	bob.waitAvatar("alice", "A")
	alice.waitAvatar("alice", "A")
	alice.wait("alice's own avatar is marked", `document.querySelector('#lobby-members li[data-user="alice"]').hasAttribute("data-me")`)
	alice.wait("the lobby counts two", `document.querySelector("#lobby-count").textContent === "(2 people)"`)
	if got := alice.text(`#lobby-members li[data-user="bob"]`); got != "B" {
		t.Errorf("bob's avatar on alice's page: %q", got)
	}

	// alice's connection is cut: she reconnects, joins again and gets the
	// room's state anew; bob was there all along, so her page tells of no
	// join or leave of his, only the re-sync. (Her own connections change:
	// that is an update of her, or, should the old one be gone before the
	// new one is stored, a leave and a join.)
	if _, err := eval[bool](alice, `(() => {
		window.roomLog = [];
		for (const ev of ["join", "leave", "sync"]) {
			window.demo.lobby.on(ev, (m) => window.roomLog.push(ev === "sync" ? "sync" : ev + ":" + m.user_id));
		}
		return true;
	})()`); err != nil {
		t.Fatal(err)
	}
	a1 := alice.connID()
	if n := px.Reset(); n < 1 {
		t.Fatalf("killed %d connections, want alice's socket", n)
	}
	alice.wait("alice on a new connection", fmt.Sprintf(`window.demo.client.state === "open" && window.demo.client.hello.conn_id !== %q`, a1))
	alice.wait("alice's lobby re-synced", `window.roomLog.includes("sync") && window.demo.lobby.state === "joined"`)
	alice.wait("alice's lobby no longer dimmed", `!document.querySelector("#lobby-members").hasAttribute("data-stale")`)
	alice.waitAvatar("bob", "B")
	log, err := eval[[]string](alice, `window.roomLog`)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(log, "join:bob") || slices.Contains(log, "leave:bob") {
		t.Errorf("alice's page after her reconnect: %v, want no join or leave of bob", log)
	}
	// bob sees alice's new connection.
	a2 := alice.connID()
	bob.wait("bob sees alice's new connection", fmt.Sprintf(
		`window.demo.lobby.member("alice")?.conns.some((c) => c.conn_id === %q)`, a2))

	// bob closes his tab: after the offline grace he leaves the room.
	closed := time.Now()
	bob.close()
	alice.waitNoAvatar("bob")
	if d := time.Since(closed); d < browserGrace*3/4 {
		t.Errorf("bob left the room %v after closing his tab, before the offline grace (%v)", d, browserGrace)
	} else {
		t.Logf("bob left the room %v after closing his tab (grace %v)", d, browserGrace)
	}
	alice.wait("the lobby counts one", `document.querySelector("#lobby-count").textContent === "(just you)"`)
}

// aliceAndBobInTheLobby opens alice's and bob's pages of the demo on one
// gateway, and waits until each sees the other in the lobby.
func aliceAndBobInTheLobby(t *testing.T) (alice, bob *page) {
	t.Helper()
	chromium := chromiumPath(t)
	gw := startDemo(t).Gateway()
	c := startChrome(t, chromium)
	alice = c.open("alice", demoURL(gw.HTTP, "alice"))
	bob = c.open("bob", demoURL(gw.HTTP, "bob"))
	alice.waitAvatar("bob", "B")
	bob.waitAvatar("alice", "A")
	return alice, bob
}

// TestBrowserRoomTyping: one person types in the lobby's box; the other
// sees "<name> is typing…" at once, and no longer once the typing signal
// expired, 3 s after the last one.
func TestBrowserRoomTyping(t *testing.T) {
	t.Parallel()
	alice, bob := aliceAndBobInTheLobby(t)

	typed := time.Now()
	alice.do("type in the lobby's box", chromedp.SendKeys(chromedp.ID("lobby-input"), "hello"))
	// The signal lasts 3 s from its arrival: bob sees it within that, or
	// never. It takes well under a second on an idle machine.
	bob.wait("alice is typing", `document.querySelector("#lobby-typing").textContent === "alice is typing…"`)
	seen := time.Since(typed)
	if got := alice.text("#lobby-typing"); got != "" {
		t.Errorf("alice's own page says %q: her own typing is not shown to her", got)
	}
	bob.wait("alice no longer typing", `document.querySelector("#lobby-typing").textContent === ""`)
	gone := time.Since(typed)
	// The signal left alice after typed, and expires 3 s after it reached
	// bob's page: it cannot end sooner.
	if gone < 3*time.Second {
		t.Errorf("alice's typing ended %v after she typed, before its 3 s expiry", gone)
	}
	t.Logf("bob saw alice typing %v after she typed, and no longer %v after", seen, gone)
}

// TestBrowserRoomInvisible: a person who turns invisible is no longer in
// the lobby for the others, and no longer in their own count; their page
// still shows the others, and does not say they are alone.
func TestBrowserRoomInvisible(t *testing.T) {
	t.Parallel()
	alice, bob := aliceAndBobInTheLobby(t)

	alice.choose("invisible")
	bob.waitNoAvatar("alice")
	bob.wait("bob's lobby counts him alone", `document.querySelector("#lobby-count").textContent === "(just you)"`)
	alice.wait("alice's lobby without her", `window.demo.lobby.state === "joined" && !window.demo.lobby.members.has("alice")`)
	alice.waitAvatar("bob", "B")
	alice.wait("alice's lobby counts bob", `document.querySelector("#lobby-count").textContent === "(1 person)"`)
}
