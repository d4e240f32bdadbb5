package callout

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/signature"
)

// djangoParts stands in for the few parts of Django the connect proxy's
// view of docs/integration.md uses (there is no Django here): responses,
// parse_cookie, the decorators, and a SessionStore over SESSIONS, whose
// sessions have a user id (_auth_user_id) and an expiry age.
const djangoParts = `
import base64, json, sys, types

def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m

class HttpResponse:
    def __init__(self, content=b"", status=200):
        self.content, self.status_code = content, status

class JsonResponse(HttpResponse):
    def __init__(self, data):
        super().__init__(json.dumps(data).encode())

def parse_cookie(s):
    out = {}
    for part in s.split(";"):
        k, _, v = part.strip().partition("=")
        if k:
            out[k] = v
    return out

SESSIONS = {}

class SessionStore:
    def __init__(self, session_key=None):
        self._data = SESSIONS.get(session_key, {})
    def get(self, key, default=None):
        return self._data.get(key, default)
    def get_expiry_age(self):
        return self._data["age"]

for n in ("django", "django.contrib", "django.contrib.sessions", "django.contrib.sessions.backends", "django.views", "django.views.decorators"):
    _module(n)
_module("django.contrib.sessions.backends.db", SessionStore=SessionStore)
_module("django.http", HttpResponse=HttpResponse, JsonResponse=JsonResponse, parse_cookie=parse_cookie)
_module("django.views.decorators.csrf", csrf_exempt=lambda f: f)
_module("django.views.decorators.http", require_POST=lambda f: f)
`

// viewDriver calls the view on every request read from standard input,
// and prints the status and body of each answer.
const viewDriver = `
data = json.load(sys.stdin)
SESSIONS.update(data["sessions"])
GREENDOT_SECRET = base64.b64decode(data["secret"])

class Request:
    def __init__(self, header, body):
        self.headers = {"Greendot-Signature": header} if header else {}
        self.body = body

out = []
for c in data["requests"]:
    r = greendot_connect(Request(c["header"], base64.b64decode(c["body"])))
    out.append({"status": r.status_code, "body": r.content.decode()})
json.dump(out, sys.stdout)
`

// TestDjangoSample runs the Django view of docs/integration.md (with the
// page's Python verify) on signed questions as the gateway sends them,
// and reads its answers as the gateway does: a session's user is let in
// for at most an hour and its session key given back; an unknown or
// missing session, and a refresh of an ended one, are refused; a bad
// signature is a 401. Without python3 it fails in CI and is skipped
// elsewhere.
func TestDjangoSample(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		tooltest.Missing(t, "no python3 for the Django sample of docs/integration.md: install it (apt-get install -y python3)")
		return
	}
	verify := doctest.Sample(t, "docs/integration.md", "def verify(")
	view := doctest.Sample(t, "docs/integration.md", "def greendot_connect(request):")
	now := time.Now()
	type request struct {
		Header string `json:"header"`
		Body   string `json:"body"`
	}
	ask := func(q ConnectQuestion, key []byte) request {
		body, err := json.Marshal(q)
		if err != nil {
			t.Fatal(err)
		}
		return request{signature.Sign(key, now, body), base64.StdEncoding.EncodeToString(body)}
	}
	connect := func(cookie string) ConnectQuestion {
		return ConnectQuestion{Type: TypeConnect, Headers: map[string]string{"Cookie": cookie, "User-Agent": "test"}}
	}
	refresh := func(session string) ConnectQuestion {
		return ConnectQuestion{Type: TypeRefresh, UserID: "7", Session: session}
	}
	cases := []struct {
		name    string
		req     request
		status  int
		refused bool
		user    string
		expires time.Duration
		session string
	}{
		{"connect", ask(connect("csrftoken=x; sessionid=k1"), secret), 200, false, "7", time.Hour, "k1"},
		{"connect, session ending soon", ask(connect("sessionid=k2"), secret), 200, false, "8", 90 * time.Second, "k2"},
		{"connect, session at its end", ask(connect("sessionid=k3"), secret), 200, false, "9", time.Second, "k3"},
		{"unknown session", ask(connect("sessionid=nope"), secret), 200, true, "", 0, ""},
		{"no cookie", ask(ConnectQuestion{Type: TypeConnect, Headers: map[string]string{}}, secret), 200, true, "", 0, ""},
		{"refresh", ask(refresh("k1"), secret), 200, false, "7", time.Hour, "k1"},
		{"refresh of an ended session", ask(refresh("gone"), secret), 200, true, "", 0, ""},
		{"another secret", ask(connect("sessionid=k1"), []byte("not the secret the app shares!!")), 401, false, "", 0, ""},
	}
	in := map[string]any{
		"secret": base64.StdEncoding.EncodeToString(secret),
		"sessions": map[string]any{
			"k1": map[string]any{"_auth_user_id": 7, "age": 1209600},
			"k2": map[string]any{"_auth_user_id": 8, "age": 90},
			"k3": map[string]any{"_auth_user_id": 9, "age": 0},
		},
	}
	var reqs []request
	for _, c := range cases {
		reqs = append(reqs, c.req)
	}
	in["requests"] = reqs
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", djangoParts+verify.Text+view.Text+viewDriver)
	cmd.Stdin = strings.NewReader(string(data))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 with %s: %v\n%s%s", view, err, out, stderr.String())
	}
	var got []struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(cases) {
		t.Fatalf("python3 printed %q: %v, want %d answers", out, err, len(cases))
	}
	for i, c := range cases {
		if got[i].Status != c.status {
			t.Errorf("%s: status %d, want %d", c.name, got[i].Status, c.status)
			continue
		}
		if c.status != 200 {
			continue
		}
		a, err := parseConnect([]byte(got[i].Body), now)
		switch {
		case err != nil:
			t.Errorf("%s: the gateway would not take %s: %v", c.name, got[i].Body, err)
		case a.Refused != c.refused || a.UserID != c.user || a.Lifetime != c.expires || a.Session != c.session:
			t.Errorf("%s: answer %s, read %+v", c.name, got[i].Body, a)
		}
	}
}
