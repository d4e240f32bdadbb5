package web_test

import (
	"fmt"
	"net/http/httptest"

	"github.com/greendot/greendot/web"
)

// The gateway serves the client to browsers at /greendot.js; a page loads
// it with <script type="module">.
func ExampleHandler() {
	h := web.Handler(web.Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", web.ScriptPath, nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"), rec.Header().Get("Cache-Control"))

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", web.DemoPath, nil)) // the demo needs Options.Demo
	fmt.Println(rec.Code)
	// Output:
	// 200 text/javascript; charset=utf-8 no-cache
	// 404
}
