package web_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
)

// TestBrowserCustomStatus: greendot.js tells the app of a watched user's
// custom status being set and cleared, sets the page's user's own (seen
// in "self" and in the record), and refuses values of the wrong type.
func TestBrowserCustomStatus(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	mutualWith(sys, "me", "cs", 1)
	c := startChrome(t, chromium)
	p := openClient(t, c, sys.Gateway().HTTP, "me", ``)
	if _, err := eval[bool](p, `(() => {
		window.changes = [];
		window.selves = [];
		gd.onChange((u, pr) => { if (u === "cs0") window.changes.push(pr.status + " " + JSON.stringify(pr.custom_status ?? null)); });
		gd.onSelf((s) => window.selves.push(JSON.stringify(s.custom_status ?? null)));
		gd.subscribe(["cs0"]);
		return true;
	})()`); err != nil {
		t.Fatal(err)
	}
	other, err := client.Dial(context.Background(), sys.Gateway().WS+"?user=cs0", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Abort() })
	p.wait("cs0 online", `window.changes.at(-1) === "online null"`)
	if err := other.SetCustomStatus("Lunch", "🥪", time.Time{}); err != nil {
		t.Fatal(err)
	}
	p.wait("cs0's custom status", `window.changes.at(-1) === 'online {"text":"Lunch","emoji":"🥪"}'`)
	if err := other.SetCustomStatus("", "", time.Time{}); err != nil {
		t.Fatal(err)
	}
	p.wait("cs0's custom status cleared", `window.changes.at(-1) === "online null"`)

	expires := time.Now().Add(time.Hour).Truncate(time.Second)
	if _, err := eval[bool](p, `(() => { gd.setCustomStatus("Focus", ":headphones:", new Date(`+strconv.FormatInt(expires.UnixMilli(), 10)+`)); return true; })()`); err != nil {
		t.Fatal(err)
	}
	p.wait("the page's own custom status in self", `window.selves.at(-1) === '{"text":"Focus","emoji":":headphones:","expires_at":`+strconv.FormatInt(expires.Unix(), 10)+`}'`)
	rec, err := sys.StatusOf("me")
	if err != nil {
		t.Fatal(err)
	}
	if want := (&presence.Custom{Text: "Focus", Emoji: ":headphones:", ExpiresAt: expires.Unix()}); !rec.Custom.Equal(want) {
		t.Errorf("the page's user's custom status: %+v, want %+v", rec.Custom, want)
	}
	for _, bad := range []string{`gd.setCustomStatus(1)`, `gd.setCustomStatus("a", null)`, `gd.setCustomStatus("a", "", "soon")`, `gd.setCustomStatus("a", "", 1.5)`} {
		if ok, err := eval[bool](p, `(() => { try { `+bad+`; return false; } catch (e) { return e instanceof TypeError; } })()`); err != nil || !ok {
			t.Errorf("%s: not a TypeError (%v)", bad, err)
		}
	}
	expectNoErrors(t, p)
}
