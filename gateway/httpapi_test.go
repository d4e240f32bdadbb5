package gateway_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
	"github.com/greendot/greendot/web"
)

// A request to an API path with a method the path does not take is
// answered 405 naming the methods it takes, and one to a path the API does
// not have 404, both as JSON like every API error: with the browser client
// served on the other paths, as a gateway process does, and without it.
func TestHTTPAPIWrongMethodAndPath(t *testing.T) {
	t.Parallel()
	for _, static := range []bool{false, true} {
		t.Run(map[bool]string{false: "api only", true: "with the browser client"}[static], func(t *testing.T) {
			cfg := gateway.Config{Policy: gateway.PolicyEveryone}
			if static {
				cfg.Static = web.Handler(web.Options{})
			}
			gw := secStart(t, systest.Options{Gateway: cfg}).Gateway()
			alice := bearer(secLongToken(t, "alice"))
			for _, tt := range []struct {
				method, path string
				status       int
				code, allow  string
			}{
				{"POST", "/api/presence/users/bob", http.StatusMethodNotAllowed, "method_not_allowed", "GET, HEAD, OPTIONS"},
				{"DELETE", "/api/presence/online", http.StatusMethodNotAllowed, "method_not_allowed", "GET, HEAD, OPTIONS"},
				{"PUT", "/api/presence/friends", http.StatusMethodNotAllowed, "method_not_allowed", "GET, HEAD, OPTIONS"},
				{"GET", "/api/presence/query", http.StatusMethodNotAllowed, "method_not_allowed", "POST, OPTIONS"},
				{"POST", "/api/rooms/doc:1", http.StatusMethodNotAllowed, "method_not_allowed", "GET, HEAD, OPTIONS"},
				{"GET", "/api/presence/user/bob", http.StatusNotFound, "not_found", ""},
				{"GET", "/api/presence/users/", http.StatusNotFound, "not_found", ""},
				{"GET", "/api/presence/users/bob/status", http.StatusNotFound, "not_found", ""},
				{"POST", gateway.InvalidatePath, http.StatusNotFound, "not_found", ""}, // only under the app policy
			} {
				var e apiErr
				st, h := apiCallHeader(t, tt.method, gw.HTTP+tt.path, alice, nil, &e)
				if st != tt.status || e.Error != tt.code || e.Message == "" || h.Get("Allow") != tt.allow {
					t.Errorf("%s %s: %d %+v Allow %q, want %d %s with a message, Allow %q",
						tt.method, tt.path, st, e, h.Get("Allow"), tt.status, tt.code, tt.allow)
				}
				if h.Get("X-Content-Type-Options") != "nosniff" {
					t.Errorf("%s %s: no X-Content-Type-Options: nosniff, and the message quotes the path", tt.method, tt.path)
				}
			}
			// The paths still answer their methods, and preflights.
			if st := apiCall(t, "GET", gw.HTTP+"/api/presence/users/bob", alice, nil, nil); st != http.StatusOK {
				t.Errorf("GET /api/presence/users/bob: %d, want 200", st)
			}
			if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", alice, map[string]any{"user_ids": []string{"bob"}}, nil); st != http.StatusOK {
				t.Errorf("POST /api/presence/query: %d, want 200", st)
			}
			pre := http.Header{"Origin": {"https://app.example.com"}, "Access-Control-Request-Method": {"GET"}}
			for _, p := range []string{"/api/presence/users/bob", "/api/presence/query"} {
				if st := apiCall(t, "OPTIONS", gw.HTTP+p, pre, nil, nil); st != http.StatusNoContent {
					t.Errorf("preflight of %s: %d, want 204", p, st)
				}
			}
		})
	}
}

// POST /api/presence/query refuses with 400 a body that is not
// {"user_ids": [...]}: one without the list (a misspelt field) is not
// answered as a query about nobody. A list of null is an empty one, as
// Go encodes a nil slice.
func TestQueryNeedsUserIDs(t *testing.T) {
	t.Parallel()
	gw := secStart(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone}}).Gateway()
	alice := bearer(secLongToken(t, "alice"))
	for _, body := range []string{`{}`, `null`, `{"userIds": ["bob"]}`, `{"user_ids": "bob"}`, `{"user_ids": ["bob"]} {}`, `["bob"]`} {
		var e apiErr
		if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", alice, []byte(body), &e); st != http.StatusBadRequest || e.Error != "bad_request" || e.Message == "" {
			t.Errorf("query %s: %d %+v, want 400 bad_request with a message", body, st, e)
		}
	}
	var q struct {
		Users  []presence.Presence `json:"users"`
		Denied []json.RawMessage   `json:"denied"`
	}
	if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", alice, []byte(`{"user_ids": ["bob", "bob"]}`), &q); st != http.StatusOK || len(q.Users) != 1 || q.Users[0].UserID != "bob" || len(q.Denied) != 0 {
		t.Errorf("query of bob twice: %d %+v, want bob once", st, q)
	}
	for _, body := range []string{`{"user_ids": null}`, `{"user_ids": []}`} {
		q.Users, q.Denied = nil, nil
		if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", alice, []byte(body), &q); st != http.StatusOK || q.Users == nil || len(q.Users) != 0 || len(q.Denied) != 0 {
			t.Errorf("query %s: %d %+v, want an answer about nobody", body, st, q)
		}
	}
}

// A gateway whose --max-query-ids is raised answers a query of that many
// ids of the longest length, not 413 for a body over the default's size.
func TestQueryBodyFitsMaxQueryIDs(t *testing.T) {
	t.Parallel()
	const n = 2000
	gw := secStart(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyEveryone, MaxQueryIDs: n}}).Gateway()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%0*d", presence.MaxUserIDLen, i)
	}
	var q struct {
		Users []presence.Presence `json:"users"`
	}
	var e apiErr
	if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", bearer(secLongToken(t, "alice")), map[string]any{"user_ids": ids}, &q); st != http.StatusOK || len(q.Users) != n {
		t.Fatalf("query of %d ids of %d characters: %d with %d users, want 200 with all", n, presence.MaxUserIDLen, st, len(q.Users))
	}
	tooBig := map[string]any{"user_ids": []string{strings.Repeat("a", n*(presence.MaxUserIDLen+8))}}
	if st := apiCall(t, "POST", gw.HTTP+"/api/presence/query", bearer(secLongToken(t, "alice")), tooBig, &e); st != http.StatusRequestEntityTooLarge || e.Error != "bad_request" {
		t.Errorf("a body over what %d ids take: %d %+v, want 413 bad_request", n, st, e)
	}
}

// TestTransferEncodingRefused: a request with Transfer-Encoding is
// refused with 400 and its connection closed, with Content-Length or
// without: with both, a proxy in front that trusts Content-Length would
// read another request than the gateway does (request smuggling, RFC 9112
// §6.1), and a request pipelined behind it must not be served. A request
// with Content-Length alone keeps its connection for the next.
func TestTransferEncodingRefused(t *testing.T) {
	t.Parallel()
	gw := secStart(t, systest.Options{}).Gateway()
	auth := "Authorization: Bearer " + secLongToken(t, "alice") + "\r\n"
	next := "GET /api/presence/users/alice HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n"
	query := func(headers, body string) string {
		return "POST /api/presence/query HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Type: application/json\r\n" + headers + "\r\n" + body
	}
	ids := `{"user_ids":["alice"]}`
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(ids), ids)
	for _, tt := range []struct {
		name    string
		request string
		status  []int // the answers, in order
		closed  bool  // the connection ends after them
	}{
		{"Content-Length and Transfer-Encoding", query(fmt.Sprintf("Content-Length: %d\r\nTransfer-Encoding: chunked\r\n", len(next)+5), "0\r\n\r\n"+next), []int{http.StatusBadRequest}, true},
		{"Transfer-Encoding alone", query("Transfer-Encoding: chunked\r\n", chunked), []int{http.StatusBadRequest}, true},
		{"Content-Length alone", query(fmt.Sprintf("Content-Length: %d\r\n", len(ids)), ids), []int{http.StatusOK, http.StatusOK}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", gw.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(nc, tt.request+next); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(nc)
			for i, want := range tt.status {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("answer %d: %v", i, err)
				}
				var e apiErr
				_ = json.NewDecoder(resp.Body).Decode(&e)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("answer %d: %d %+v, want %d", i, resp.StatusCode, e, want)
				}
				if want == http.StatusBadRequest && (e.Error != "bad_request" || e.Message == "" || !resp.Close) {
					t.Errorf("answer %d: %+v, close %v; want bad_request with a message, and the connection closed", i, e, resp.Close)
				}
			}
			if !tt.closed {
				return
			}
			if resp, err := http.ReadResponse(br, nil); err == nil {
				t.Errorf("answered again (%s) on a connection that should have ended", resp.Status)
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("after the answers: %v, want the connection closed", err)
			}
		})
	}
}
