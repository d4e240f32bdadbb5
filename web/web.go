package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// The paths Handler serves.
const (
	// ScriptPath is the JavaScript client, an ES module.
	ScriptPath = "/greendot.js"
	// TypesPath is the client's TypeScript declarations.
	TypesPath = "/greendot.d.ts"
	// DemoPath is the demo page (demo mode only).
	DemoPath = "/"
	// DemoAPIPath prefixes the demo's graph endpoints (demo mode only).
	DemoAPIPath = "/demo/api/"
)

//go:embed greendot.js greendot.d.ts demo
var files embed.FS

// Options configures Handler.
type Options struct {
	// Demo serves the demo page at DemoPath, its assets under /demo/, and
	// the endpoints under DemoAPIPath that let anyone write anyone's follow
	// edges and privacy settings, taking the caller from ?user= with no
	// proof. Only for standalone mode on loopback, next to dev auth.
	Demo bool
	// Store writes the graph for the demo endpoints. Required with Demo.
	// The caller owns it.
	Store *presence.Store
	// Logger receives the handler's logs; nil discards them.
	Logger *slog.Logger
}

// asset is one embedded file, ready to serve.
type asset struct {
	name        string
	body        []byte
	contentType string
	etag        string
	// cors lets pages of any origin load the file (a public script).
	cors bool
	// page marks an HTML page, which gets a content security policy.
	page bool
}

// pageCSP is the demo page's content security policy: everything from the
// page's own origin (connect-src 'self' covers ws:// and wss:// to it),
// nothing inline, no framing.
const pageCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'"

func loadAsset(name, contentType string) *asset {
	body, err := files.ReadFile(name)
	if err != nil {
		// The file list is fixed at build time: a missing file is a bug
		// in this package, caught by its tests.
		panic(fmt.Sprintf("web: embedded file %q: %v", name, err))
	}
	sum := sha256.Sum256(body)
	return &asset{
		name:        path.Base(name),
		body:        body,
		contentType: contentType,
		etag:        `"` + hex.EncodeToString(sum[:12]) + `"`,
	}
}

// ServeHTTP serves the file: every response may be cached but must be
// revalidated (the paths carry no version, so a new release must show at
// once), and a revalidation with a matching ETag gets 304.
func (a *asset) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", a.etag)
	if a.cors {
		h.Set("Access-Control-Allow-Origin", "*")
	}
	if a.page {
		h.Set("Content-Security-Policy", pageCSP)
		h.Set("Referrer-Policy", "same-origin")
	}
	http.ServeContent(w, r, a.name, time.Time{}, bytes.NewReader(a.body))
}

// Handler returns the handler of the client and, with o.Demo, of the demo.
// It answers 404 for every other path and 405 for a method a path does not
// take. It panics if o.Demo is set without o.Store. The handler is safe for
// concurrent use.
func Handler(o Options) http.Handler {
	if o.Demo && o.Store == nil {
		panic("web: Options.Demo needs Options.Store")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	script := loadAsset("greendot.js", "text/javascript; charset=utf-8")
	script.cors = true
	types := loadAsset("greendot.d.ts", "application/typescript; charset=utf-8")
	types.cors = true
	h := &handler{routes: map[string]route{
		ScriptPath: {get: script},
		TypesPath:  {get: types},
	}}
	if o.Demo {
		index := loadAsset("demo/index.html", "text/html; charset=utf-8")
		index.page = true
		h.routes[DemoPath] = route{get: index}
		h.routes["/demo/demo.js"] = route{get: loadAsset("demo/demo.js", "text/javascript; charset=utf-8")}
		h.routes["/demo/demo.css"] = route{get: loadAsset("demo/demo.css", "text/css; charset=utf-8")}
		h.routes["/demo/favicon.svg"] = route{get: loadAsset("demo/favicon.svg", "image/svg+xml")}
		d := &demoAPI{store: o.Store, log: o.Logger.With("svc", "web")}
		h.routes[DemoAPIPath+"graph"] = route{get: http.HandlerFunc(d.graph)}
		h.routes[DemoAPIPath+"follow"] = route{post: http.HandlerFunc(d.follow)}
		h.routes[DemoAPIPath+"unfollow"] = route{post: http.HandlerFunc(d.unfollow)}
		h.routes[DemoAPIPath+"privacy"] = route{post: http.HandlerFunc(d.privacy)}
	}
	return h
}

// route is what one path answers, by method.
type route struct {
	get, post http.Handler
}

func (rt route) allow() string {
	switch {
	case rt.get != nil && rt.post != nil:
		return "GET, HEAD, POST"
	case rt.post != nil:
		return "POST"
	default:
		return "GET, HEAD"
	}
}

type handler struct {
	routes map[string]route
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	rt, ok := h.routes[r.URL.Path]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("nothing at %s", r.URL.Path))
		return
	}
	var next http.Handler
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		next = rt.get
	case http.MethodPost:
		next = rt.post
	}
	if next == nil {
		w.Header().Set("Allow", rt.allow())
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s takes %s", r.URL.Path, rt.allow()))
		return
	}
	next.ServeHTTP(w, r)
}

// apiError is the body of an error answer, as in the gateway's HTTP API.
type apiError struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, apiError{Error: code, Message: msg})
}
