package web_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
)

// TestBrowserPlatforms: greendot.js names its platform at connect, tells
// the app of a watched user's platforms changing, however the status
// stays the same, and says background() to the gateway.
func TestBrowserPlatforms(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	mutualWith(sys, "me", "pf", 1)
	c := startChrome(t, chromium)
	p := openClient(t, c, sys.Gateway().HTTP, "me", `platform: "desktop"`)
	if _, err := eval[bool](p, `(() => {
		window.changes = [];
		gd.onChange((u, pr) => { if (u === "pf0") window.changes.push(pr.status + " " + JSON.stringify(pr.platforms ?? {})); });
		gd.subscribe(["pf0"]);
		return true;
	})()`); err != nil {
		t.Fatal(err)
	}
	dial := func(platform string) *client.Conn {
		t.Helper()
		conn, err := client.Dial(context.Background(), sys.Gateway().WS+"?user=pf0&platform="+platform, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Abort() })
		return conn
	}
	saw := func(want string) {
		t.Helper()
		b, _ := json.Marshal(want)
		p.wait("pf0 "+want, `window.changes.at(-1) === `+string(b))
	}
	dial("web")
	saw(`online {"web":"active"}`)
	phone := dial("mobile")
	saw(`online {"web":"active","mobile":"active"}`)
	if err := phone.Close(); err != nil {
		t.Fatal(err)
	}
	saw(`online {"web":"active"}`)

	rec, err := sys.StatusOf("me")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(rec.Platforms); string(b) != `{"desktop":"active"}` {
		t.Errorf("the page's user is on %s, want desktop (active)", b)
	}

	// background() tells the gateway; a bad grace is refused in the page.
	if _, err := eval[bool](p, `(() => { try { gd.background(-1); return false; } catch (e) { return e instanceof TypeError; } })()`); err != nil {
		t.Fatal(err)
	}
	if _, err := eval[bool](p, `(() => { gd.background(60000); return true; })()`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(pageWait)
	for {
		rec, err := sys.StatusOf("me")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(rec.Platforms)
		if string(b) == `{"desktop":"background"}` && rec.Status == presence.Away {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after background(): %s on %s, want away in the background", rec.Status, b)
		}
		time.Sleep(20 * time.Millisecond) // polling the record, bounded by deadline
	}
	expectNoErrors(t, p)
}
