package web_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/web"
)

// openStore runs a NATS server and opens greendot's buckets on it.
func openStore(t *testing.T) *presence.Store {
	t.Helper()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv, nats.Name("web test store"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatalf("open buckets: %v", err)
	}
	return store
}

type response struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, srv *httptest.Server, method, path, contentType, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{res.StatusCode, res.Header, string(data)}
}

func TestHandlerServesTheClient(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(web.Handler(web.Options{}))
	defer srv.Close()
	src, err := os.ReadFile("greendot.js")
	if err != nil {
		t.Fatal(err)
	}

	r := do(t, srv, "GET", web.ScriptPath, "", "")
	if r.status != 200 || r.body != string(src) {
		t.Fatalf("GET %s: status %d, %d bytes; want 200 and greendot.js (%d bytes)", web.ScriptPath, r.status, len(r.body), len(src))
	}
	for k, want := range map[string]string{
		"Content-Type":                "text/javascript; charset=utf-8",
		"Cache-Control":               "no-cache",
		"X-Content-Type-Options":      "nosniff",
		"Access-Control-Allow-Origin": "*",
	} {
		if got := r.header.Get(k); got != want {
			t.Errorf("%s: got %q, want %q", k, got, want)
		}
	}
	etag := r.header.Get("ETag")
	if len(etag) < 10 || etag[0] != '"' {
		t.Fatalf("ETag = %q, want a strong validator", etag)
	}

	// A cached copy is revalidated with its ETag.
	if r := do(t, srv, "GET", web.ScriptPath, "", "", "If-None-Match", etag); r.status != http.StatusNotModified || r.body != "" {
		t.Errorf("revalidation: status %d with %d bytes, want 304 and no body", r.status, len(r.body))
	}
	if r := do(t, srv, "GET", web.ScriptPath, "", "", "If-None-Match", `"stale"`); r.status != 200 {
		t.Errorf("revalidation of a stale copy: status %d, want 200", r.status)
	}
	if r := do(t, srv, "HEAD", web.ScriptPath, "", ""); r.status != 200 || r.body != "" || r.header.Get("ETag") != etag {
		t.Errorf("HEAD: status %d, %d bytes, ETag %q", r.status, len(r.body), r.header.Get("ETag"))
	}

	r = do(t, srv, "GET", web.TypesPath, "", "")
	if r.status != 200 || !strings.Contains(r.body, "export declare class GreenDot") ||
		r.header.Get("Content-Type") != "application/typescript; charset=utf-8" {
		t.Errorf("GET %s: status %d, type %q", web.TypesPath, r.status, r.header.Get("Content-Type"))
	}
}

func TestHandlerRefusesEverythingElse(t *testing.T) {
	t.Parallel()
	plain := httptest.NewServer(web.Handler(web.Options{}))
	defer plain.Close()
	demo := httptest.NewServer(web.Handler(web.Options{Demo: true, Store: openStore(t)}))
	defer demo.Close()

	tests := []struct {
		name         string
		srv          *httptest.Server
		method, path string
		status       int
		code         string
		allow        string
	}{
		{"unknown path", plain, "GET", "/nope", 404, "not_found", ""},
		{"no demo page without demo", plain, "GET", "/", 404, "not_found", ""},
		{"no demo api without demo", plain, "POST", "/demo/api/follow?user=a", 404, "not_found", ""},
		{"no demo assets without demo", plain, "GET", "/demo/demo.js", 404, "not_found", ""},
		{"no listing of the embedded files", demo, "GET", "/demo/", 404, "not_found", ""},
		{"no path tricks", demo, "GET", "/demo/../greendot.js", 404, "not_found", ""},
		{"post to the script", plain, "POST", web.ScriptPath, 405, "method_not_allowed", "GET, HEAD"},
		{"delete the page", demo, "DELETE", "/", 405, "method_not_allowed", "GET, HEAD"},
		{"get a write endpoint", demo, "GET", "/demo/api/follow?user=a", 405, "method_not_allowed", "POST"},
		{"post the graph", demo, "POST", "/demo/api/graph?user=a", 405, "method_not_allowed", "GET, HEAD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, tt.srv, tt.method, tt.path, "", "")
			if r.status != tt.status {
				t.Fatalf("status %d, want %d (%s)", r.status, tt.status, r.body)
			}
			var e struct{ Error, Message string }
			if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error != tt.code || e.Message == "" {
				t.Errorf("body %q, want error %q with a message", r.body, tt.code)
			}
			if got := r.header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
		})
	}
}

func TestDemoPage(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(web.Handler(web.Options{Demo: true, Store: openStore(t)}))
	defer srv.Close()
	r := do(t, srv, "GET", "/", "", "")
	if r.status != 200 || !strings.Contains(r.body, `<script type="module" src="/demo/demo.js">`) {
		t.Fatalf("GET /: status %d", r.status)
	}
	if got := r.header.Get("Content-Type"); got != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", got)
	}
	csp := r.header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("Content-Security-Policy %q lacks %q", csp, want)
		}
	}
	for path, typ := range map[string]string{
		"/demo/demo.js":     "text/javascript; charset=utf-8",
		"/demo/demo.css":    "text/css; charset=utf-8",
		"/demo/favicon.svg": "image/svg+xml",
	} {
		if r := do(t, srv, "GET", path, "", ""); r.status != 200 || r.header.Get("Content-Type") != typ || r.header.Get("Cache-Control") != "no-cache" {
			t.Errorf("GET %s: status %d, type %q, cache %q", path, r.status, r.header.Get("Content-Type"), r.header.Get("Cache-Control"))
		}
	}
}

func TestHandlerNeedsAStoreForTheDemo(t *testing.T) {
	t.Parallel()
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "Store") {
			t.Fatalf("recovered %v, want a panic naming Store", r)
		}
	}()
	web.Handler(web.Options{Demo: true})
}

type graph struct {
	UserID    string `json:"user_id"`
	Following []struct {
		UserID     string `json:"user_id"`
		FollowsYou bool   `json:"follows_you"`
	} `json:"following"`
	Followers []string `json:"followers"`
	LastSeen  string   `json:"last_seen"`
}

func readGraph(t *testing.T, srv *httptest.Server, user string) graph {
	t.Helper()
	r := do(t, srv, "GET", "/demo/api/graph?user="+user, "", "")
	if r.status != 200 {
		t.Fatalf("graph of %s: status %d: %s", user, r.status, r.body)
	}
	var g graph
	if err := json.Unmarshal([]byte(r.body), &g); err != nil {
		t.Fatalf("graph of %s: %v: %s", user, err, r.body)
	}
	return g
}

func TestDemoAPIWritesTheGraph(t *testing.T) {
	t.Parallel()
	store := openStore(t)
	srv := httptest.NewServer(web.Handler(web.Options{Demo: true, Store: store}))
	defer srv.Close()
	ctx := context.Background()
	const js = "application/json"

	g := readGraph(t, srv, "alice")
	if g.UserID != "alice" || len(g.Following) != 0 || len(g.Followers) != 0 || g.LastSeen != "contacts" {
		t.Fatalf("empty graph = %+v", g)
	}

	// One way: alice follows bob.
	if r := do(t, srv, "POST", "/demo/api/follow?user=alice", js, `{"user_id":"bob"}`); r.status != 204 {
		t.Fatalf("follow: %d %s", r.status, r.body)
	}
	if ok, err := store.Follows(ctx, "alice", "bob"); err != nil || !ok {
		t.Fatalf("alice follows bob: %v %v", ok, err)
	}
	if ok, _ := store.Follows(ctx, "bob", "alice"); ok {
		t.Fatal("bob follows alice without being asked")
	}
	g = readGraph(t, srv, "alice")
	if len(g.Following) != 1 || g.Following[0].UserID != "bob" || g.Following[0].FollowsYou {
		t.Errorf("alice's graph = %+v", g)
	}
	if g := readGraph(t, srv, "bob"); !slices.Equal(g.Followers, []string{"alice"}) || len(g.Following) != 0 {
		t.Errorf("bob's graph = %+v", g)
	}

	// Both ways: alice and carol follow each other.
	if r := do(t, srv, "POST", "/demo/api/follow?user=alice", js+"; charset=utf-8", `{"user_id":"carol","both":true}`); r.status != 204 {
		t.Fatalf("follow both: %d %s", r.status, r.body)
	}
	g = readGraph(t, srv, "alice")
	if len(g.Following) != 2 || g.Following[1].UserID != "carol" || !g.Following[1].FollowsYou || !slices.Equal(g.Followers, []string{"carol"}) {
		t.Errorf("alice's graph = %+v", g)
	}

	if r := do(t, srv, "POST", "/demo/api/unfollow?user=alice", js, `{"user_id":"bob"}`); r.status != 204 {
		t.Fatalf("unfollow: %d %s", r.status, r.body)
	}
	if ok, _ := store.Follows(ctx, "alice", "bob"); ok {
		t.Error("alice still follows bob")
	}

	if r := do(t, srv, "POST", "/demo/api/privacy?user=alice", js, `{"last_seen":"nobody"}`); r.status != 204 {
		t.Fatalf("privacy: %d %s", r.status, r.body)
	}
	if st, err := store.Settings(ctx, "alice"); err != nil || st.LastSeenVisibility() != presence.Nobody {
		t.Errorf("settings = %+v, %v", st, err)
	}
	if g := readGraph(t, srv, "alice"); g.LastSeen != "nobody" {
		t.Errorf("last_seen = %q", g.LastSeen)
	}
}

func TestDemoAPIRefusesBadInput(t *testing.T) {
	t.Parallel()
	store := openStore(t)
	srv := httptest.NewServer(web.Handler(web.Options{Demo: true, Store: store}))
	defer srv.Close()
	const js = "application/json"
	tests := []struct {
		name, path, contentType, body string
		header                        []string
		status                        int
		code                          string
	}{
		{"no caller", "/demo/api/follow", js, `{"user_id":"bob"}`, nil, 401, "unauthorized"},
		{"bad caller", "/demo/api/follow?user=a.b", js, `{"user_id":"bob"}`, nil, 400, "invalid_user_id"},
		{"bad caller of graph", "/demo/api/graph?user=%2A", "", "", nil, 400, "invalid_user_id"},
		{"bad target", "/demo/api/follow?user=alice", js, `{"user_id":"b*b"}`, nil, 400, "invalid_user_id"},
		{"missing target", "/demo/api/follow?user=alice", js, `{}`, nil, 400, "invalid_user_id"},
		{"oneself", "/demo/api/follow?user=alice", js, `{"user_id":"alice"}`, nil, 400, "bad_request"},
		{"not json", "/demo/api/follow?user=alice", js, `user_id=bob`, nil, 400, "bad_request"},
		{"wrong type", "/demo/api/follow?user=alice", js, `{"user_id":42}`, nil, 400, "bad_request"},
		{"two objects", "/demo/api/follow?user=alice", js, `{"user_id":"bob"}{"user_id":"carol"}`, nil, 400, "bad_request"},
		{"too big", "/demo/api/follow?user=alice", js, `{"user_id":"bob","pad":"` + strings.Repeat("x", 5000) + `"}`, nil, 413, "bad_request"},
		{"a form post", "/demo/api/follow?user=alice", "application/x-www-form-urlencoded", `user_id=bob`, nil, 415, "bad_request"},
		{"no content type", "/demo/api/follow?user=alice", "", `{"user_id":"bob"}`, nil, 415, "bad_request"},
		{"another site", "/demo/api/follow?user=alice", js, `{"user_id":"bob"}`, []string{"Sec-Fetch-Site", "cross-site"}, 403, "forbidden_origin"},
		{"another origin", "/demo/api/follow?user=alice", js, `{"user_id":"bob"}`, []string{"Origin", "http://evil.example"}, 403, "forbidden_origin"},
		{"bad visibility", "/demo/api/privacy?user=alice", js, `{"last_seen":"friends"}`, nil, 400, "bad_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := "POST"
			if tt.body == "" {
				method = "GET"
			}
			r := do(t, srv, method, tt.path, tt.contentType, tt.body, tt.header...)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d (%s)", r.status, tt.status, r.body)
			}
			var e struct{ Error, Message string }
			if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error != tt.code || e.Message == "" {
				t.Errorf("body %q, want error %q with a message", r.body, tt.code)
			}
		})
	}
	// Nothing was written.
	g := readGraph(t, srv, "alice")
	if len(g.Following) != 0 || len(g.Followers) != 0 || g.LastSeen != "contacts" {
		t.Errorf("bad requests changed the graph: %+v", g)
	}
}

func TestDemoAPIWithNATSDown(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv, nats.Name("web test store"), nats.MaxReconnects(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := httptest.NewServer(web.Handler(web.Options{Demo: true, Store: store}))
	defer h.Close()
	nc.Close()
	for _, tt := range []struct{ method, path, body string }{
		{"GET", "/demo/api/graph?user=alice", ""},
		{"POST", "/demo/api/follow?user=alice", `{"user_id":"bob"}`},
		{"POST", "/demo/api/privacy?user=alice", `{"last_seen":"everyone"}`},
	} {
		r := do(t, h, tt.method, tt.path, "application/json", tt.body)
		if r.status != 503 || !strings.Contains(r.body, `"unavailable"`) {
			t.Errorf("%s %s with NATS closed: %d %s, want 503 unavailable", tt.method, tt.path, r.status, r.body)
		}
	}
}

// TestPackageJSON checks that the npm package points at files that exist.
func TestPackageJSON(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("package.json")
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Name    string            `json:"name"`
		Type    string            `json:"type"`
		Main    string            `json:"main"`
		Types   string            `json:"types"`
		Files   []string          `json:"files"`
		Exports map[string]any    `json:"exports"`
		Deps    map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(data, &pkg); err != nil {
		t.Fatalf("package.json: %v", err)
	}
	if pkg.Name != "@greendot/client" || pkg.Type != "module" || len(pkg.Deps) != 0 {
		t.Errorf("name %q, type %q, %d dependencies", pkg.Name, pkg.Type, len(pkg.Deps))
	}
	dot, ok := pkg.Exports["."].(map[string]any)
	if !ok || dot["types"] != pkg.Types || dot["default"] != pkg.Main {
		t.Errorf(`exports["."] = %v, want types %q and default %q`, pkg.Exports["."], pkg.Types, pkg.Main)
	}
	for _, f := range append([]string{pkg.Main, pkg.Types}, pkg.Files...) {
		if _, err := os.Stat(filepath.FromSlash(strings.TrimPrefix(f, "./"))); err != nil {
			t.Errorf("package.json names %s: %v", f, err)
		}
	}
}
