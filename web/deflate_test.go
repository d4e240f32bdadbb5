package web_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/greendot/greendot/internal/tcpproxy"
	"github.com/greendot/greendot/system/systest"
)

// compressedUpgrades returns the count of upgrades g accepted with
// permessage-deflate.
func compressedUpgrades(t *testing.T, g *systest.Gateway) float64 {
	t.Helper()
	families, err := g.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "greendot_gateway_upgrades_compressed_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no greendot_gateway_upgrades_compressed_total")
	return 0
}

// TestBrowserDeflate: Chromium offers permessage-deflate by itself and the
// gateway accepts it, with no context takeover either way; a presence_init
// of 40 users (mutual followers) reads whole in the page but never
// crosses the wire in clear (the bytes from the gateway, through a proxy,
// hold the small hello as it is, not it), and the gateway counts the
// compressed upgrade.
func TestBrowserDeflate(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	sys := startDemo(t)
	gw := sys.Gateway()
	// What the gateway sends the browser passes a proxy that keeps it.
	var (
		mu   sync.Mutex
		wire []byte
	)
	px := tcpproxy.Start(t, gw.Addr, func(*tcpproxy.Link) (tcpproxy.Filter, tcpproxy.Filter) {
		return nil, func(b []byte) []byte {
			mu.Lock()
			wire = append(wire, b...)
			mu.Unlock()
			return b
		}
	})
	c := startChrome(t, chromium)
	p := c.open("deflate", "http://"+px.Addr()+"/")
	before := compressedUpgrades(t, gw)

	ids := make([]string, 40)
	for i := range ids {
		peer := fmt.Sprintf("deflate-peer-%03d", i)
		sys.Mutual("deflate-watcher", peer)
		ids[i] = fmt.Sprintf("%q", peer)
	}
	expr := fmt.Sprintf(`new Promise((resolve, reject) => {
		const ws = new WebSocket(location.origin.replace(/^http/, "ws") + "/ws?user=deflate-watcher");
		ws.onerror = () => reject(new Error("socket error"));
		ws.onclose = (e) => reject(new Error("closed " + e.code + " " + e.reason));
		ws.onmessage = (e) => {
			const m = JSON.parse(e.data);
			if (m.type === "hello") {
				ws.send(JSON.stringify({type: "subscribe", id: "s1", user_ids: [%s]}));
			} else if (m.type === "presence_init") {
				ws.onclose = null;
				ws.close();
				resolve({extensions: ws.extensions, users: m.users.length, bytes: e.data.length});
			}
		};
	})`, strings.Join(ids, ","))
	type result struct {
		Extensions string `json:"extensions"`
		Users      int    `json:"users"`
		Bytes      int    `json:"bytes"`
	}
	res, err := evalWithin[result](p, pageWait, expr)
	if err != nil {
		t.Fatalf("%v\n%s", err, p.diagnostics())
	}
	for _, want := range []string{"permessage-deflate", "server_no_context_takeover", "client_no_context_takeover"} {
		if !strings.Contains(res.Extensions, want) {
			t.Errorf("the socket's extensions %q lack %s", res.Extensions, want)
		}
	}
	if res.Users != len(ids) || res.Bytes < 1024 {
		t.Errorf("presence_init of %d users in %d bytes, want %d users in more than 1 KiB", res.Users, res.Bytes, len(ids))
	}
	// The page read the presence_init, but it never crossed the wire as
	// it reads: it came compressed.
	mu.Lock()
	inClear := bytes.Contains(wire, []byte(`{"type":"presence_init"`))
	hello := bytes.Contains(wire, []byte(`{"type":"hello"`))
	mu.Unlock()
	if inClear || !hello {
		t.Errorf("the wire from the gateway holds presence_init in clear %v, hello (small, sent as it is) %v", inClear, hello)
	}
	if after := compressedUpgrades(t, gw); after < before+1 {
		t.Errorf("compressed upgrades %v before, %v after", before, after)
	}
	t.Logf("extensions %q; presence_init of %d bytes inflated by the browser", res.Extensions, res.Bytes)
}
