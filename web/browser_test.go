package web_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/internal/tcpproxy"
	"github.com/greendot/greendot/internal/testlog"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
	"github.com/greendot/greendot/web"
)

// The browser tests drive Debian's Chromium through the DevTools protocol
// (chromedp), against a whole greendot system in the test process, with
// fast timings. Without Chromium they fail in CI (CI=true) and are skipped
// elsewhere, with a line that says how to install it.

// Timings of the system under the browser tests.
const (
	browserTTL       = 2 * time.Second
	browserHeartbeat = 500 * time.Millisecond
	browserGrace     = time.Second
	// pageWait bounds every wait for something the page shows.
	pageWait = 10 * time.Second
)

// fastPage is the demo page's query string for fast reconnects and graph
// reads.
const fastPage = "backoff_base_ms=100&backoff_max_ms=1000&drain_jitter_ms=300&graph_poll_ms=250"

// chromiumPath returns the Chromium to drive: $GREENDOT_CHROMIUM, or
// Debian's chromium. When there is none it fails the test in CI (the
// environment variable CI is true), where the browser tests are
// mandatory, and skips it elsewhere, so that go test ./... passes on a
// fresh machine.
func chromiumPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("GREENDOT_CHROMIUM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("GREENDOT_CHROMIUM=%s: %v (unset it to use Debian's: apt-get install -y chromium)", p, err)
		}
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	tooltest.Missing(t, "no Chromium for the browser tests: install it (apt-get install -y chromium) "+
		"or set GREENDOT_CHROMIUM to a Chromium or Chrome binary")
	return ""
}

// demoSystem is greendot with the demo: embedded NATS, reaper, fanout and
// a gateway serving web.Handler in demo mode.
type demoSystem struct {
	*systest.System
	store *presence.Store
	cfg   gateway.Config
}

func startDemo(t *testing.T) *demoSystem {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv, nats.Name("web demo store"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatalf("open buckets: %v", err)
	}
	cfg := gateway.Config{
		ConnTTL:           browserTTL,
		HeartbeatInterval: browserHeartbeat,
		OfflineGrace:      browserGrace,
		BatchInterval:     20 * time.Millisecond,
		Static:            web.Handler(web.Options{Demo: true, Store: store, Logger: testlog.New(t)}),
	}
	sys := systest.Start(t, systest.Options{Server: srv, Gateway: cfg})
	return &demoSystem{System: sys, store: store, cfg: cfg}
}

// chrome is a running Chromium.
type chrome struct {
	t   *testing.T
	ctx context.Context
}

// startChrome starts the headless Chromium at path (from chromiumPath)
// with a fresh profile; it is closed when the test ends.
func startChrome(t *testing.T, path string) *chrome {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.WindowSize(960, 800),
		// No user-data-dir: chromedp makes a fresh one and removes it.
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	// The first action starts the browser and binds the browser's life to
	// the context it runs on, so it cannot carry a timeout of its own:
	// bound it from here.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	var err error
	select {
	case err = <-started:
	case <-time.After(30 * time.Second):
		err = errors.New("not started within 30s")
	}
	if err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("start %s: %v", path, err)
	}
	t.Cleanup(func() {
		closing, done := context.WithTimeout(ctx, 10*time.Second)
		defer done()
		_ = chromedp.Cancel(closing)
		cancel()
		cancelAlloc()
	})
	return &chrome{t: t, ctx: ctx}
}

// page is one tab in its own browser context (an incognito profile, with
// its own window), as a separate person's browser would be.
type page struct {
	t      *testing.T
	name   string
	ctx    context.Context
	cancel context.CancelFunc

	mu         sync.Mutex
	exceptions []string
	logs       []string
}

// open opens url in a new browser context and waits for it to load.
func (c *chrome) open(name, url string) *page {
	c.t.Helper()
	ctx, cancel := chromedp.NewContext(c.ctx, chromedp.WithNewBrowserContext())
	p := &page{t: c.t, name: name, ctx: ctx, cancel: cancel}
	if err := chromedp.Listen(ctx, p.event); err != nil {
		cancel()
		c.t.Fatalf("%s: open a tab: %v", name, err)
	}
	if _, err := chromedp.Call(ctx, cdplog.Enable, cdp.Empty{}); err != nil {
		c.t.Fatalf("%s: enable the log: %v", name, err)
	}
	c.t.Cleanup(p.close)
	p.do("load "+url, chromedp.Navigate(url))
	return p
}

// event records what the page reports: uncaught exceptions fail the test.
func (p *page) event(ev any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil && d.Exception.Description != "" {
			msg = d.Exception.Description
		}
		p.exceptions = append(p.exceptions, fmt.Sprintf("%s (%s:%d)", msg, d.URL, d.LineNumber+1))
	case *runtime.EventConsoleAPICalled:
		var args []string
		for _, a := range ev.Args {
			if a.Value != nil {
				args = append(args, string(a.Value))
			} else {
				args = append(args, a.Description)
			}
		}
		p.logs = append(p.logs, fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
	case *cdplog.EventEntryAdded:
		p.logs = append(p.logs, fmt.Sprintf("%s %s: %s", ev.Entry.Source, ev.Entry.Level, ev.Entry.Text))
		if strings.Contains(ev.Entry.Text, "Content Security Policy") {
			// The page broke its own policy: something it needs is blocked.
			p.exceptions = append(p.exceptions, ev.Entry.Text)
		}
	}
	if len(p.logs) > 200 {
		p.logs = p.logs[len(p.logs)-200:]
	}
}

// close closes the tab and its browser context, and fails the test if the
// page threw an exception nobody caught.
func (p *page) close() {
	p.cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.exceptions {
		p.t.Errorf("%s: uncaught exception in the page: %s", p.name, e)
	}
	p.exceptions = nil
}

// diagnostics describes the page, for a failure message.
func (p *page) diagnostics() string {
	ctx, cancel := context.WithTimeout(p.ctx, 3*time.Second)
	defer cancel()
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`(document.querySelector("main")?.innerText ?? "") + "\nstates: " + JSON.stringify(window.demo?.states ?? [])`))
	if err != nil {
		text = fmt.Sprintf("(page text unavailable: %v)", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("--- %s shows:\n%s\n--- %s logged:\n%s", p.name, text, p.name, strings.Join(p.logs, "\n"))
}

// do runs actions in the page, bounded in time.
func (p *page) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, pageWait)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %s: %v\n%s", p.name, what, err, p.diagnostics())
	}
}

// eval evaluates a JavaScript expression in the page (awaiting a promise).
func eval[T any](p *page, expr string) (T, error) {
	return evalWithin[T](p, pageWait, expr)
}

// evalWithin is eval with a time bound of its own.
func evalWithin[T any](p *page, timeout time.Duration, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
}

// wait polls a boolean JavaScript expression until it is true, and fails
// the test when it is not within pageWait.
func (p *page) wait(what, expr string) {
	p.t.Helper()
	deadline := time.Now().Add(pageWait)
	var last error
	for time.Now().Before(deadline) {
		ok, err := eval[bool](p, expr)
		if err == nil && ok {
			return
		}
		last = err
		time.Sleep(20 * time.Millisecond) // polling a page, bounded by the deadline
	}
	p.t.Fatalf("%s: %s: not seen within %v (%v)\n%s", p.name, what, pageWait, last, p.diagnostics())
}

// waitDot waits until the page shows user's dot with status.
func (p *page) waitDot(user, status string) {
	p.t.Helper()
	p.wait(fmt.Sprintf("%s's dot %s", user, status), fmt.Sprintf(
		`document.querySelector('#following li[data-user=%q] .dot')?.dataset.status === %q`, user, status))
}

// waitSelf waits until the page shows its own dot with status.
func (p *page) waitSelf(status string) {
	p.t.Helper()
	p.wait("own dot "+status, fmt.Sprintf(`document.querySelector('#me-dot')?.dataset.status === %q`, status))
}

// text returns the text of the first element matching a CSS selector.
func (p *page) text(sel string) string {
	p.t.Helper()
	s, err := eval[string](p, fmt.Sprintf(`document.querySelector(%q)?.textContent ?? ""`, sel))
	if err != nil {
		p.t.Fatalf("%s: text of %s: %v", p.name, sel, err)
	}
	return s
}

// setWindow minimizes or restores the page's window. A minimized window's
// page is hidden for real: the browser sets document.visibilityState and
// fires visibilitychange itself, and throttles the page's timers as it
// does for any hidden tab. Nothing in the page is overridden.
func (p *page) setWindow(state browser.WindowState) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, pageWait)
	defer cancel()
	w, err := chromedp.CallBrowser(ctx, browser.GetWindowForTarget,
		browser.GetWindowForTargetParams{TargetID: chromedp.FromContext(p.ctx).Target.TargetID})
	if err == nil {
		_, err = chromedp.CallBrowser(ctx, browser.SetWindowBounds,
			browser.SetWindowBoundsParams{WindowID: w.WindowID, Bounds: &browser.Bounds{WindowState: state}})
	}
	if err != nil {
		p.t.Fatalf("%s: set window %s: %v", p.name, state, err)
	}
}

// proxy is a TCP proxy between the browser and a gateway, standing in for
// a load balancer: the test can point it at another gateway (SetTarget),
// and reset every connection through it at once (Reset), as a network
// failure would.
type proxy struct{ *tcpproxy.Proxy }

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	return &proxy{tcpproxy.Start(t, target, nil)}
}

// URL returns the proxy's http:// base.
func (p *proxy) URL() string { return "http://" + p.Addr() }
