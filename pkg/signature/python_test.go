package signature_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/signature"
)

// pythonDriver runs verify, the sample above it, on every case read from
// standard input, and prints the answers, or the exception a case raised.
const pythonDriver = `
import base64, json, sys
out = []
for c in json.load(sys.stdin):
    try:
        out.append(verify(base64.b64decode(c["secret"]), c["header"], base64.b64decode(c["body"])))
    except Exception as e:
        out.append(repr(e))
json.dump(out, sys.stdout)
`

// TestPythonVerify runs the Python verify of docs/integration.md on
// signatures made by Sign: it says yes to those Verify takes and no to
// the others, and raises on none, so that a receiver that copies it
// answers 401, never 500, to a request without the header or with a
// malformed one. Without python3 it fails in CI and is skipped elsewhere.
func TestPythonVerify(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		tooltest.Missing(t, "no python3 for the Python sample of docs/integration.md: install it (apt-get install -y python3)")
		return
	}
	sample := doctest.Sample(t, "docs/integration.md", "def verify(")
	secret := []byte("0123456789abcdef0123")
	body := []byte(`{"events":[{"user_id":"alice","status":"offline","devices":0,"rev":7,"at":1}]}`)
	now := time.Now()
	ts := strconv.FormatInt(now.Unix(), 10)
	sig := signature.Signature(secret, now.Unix(), body)
	stale := time.Now().Add(-10 * time.Minute)
	str := func(s string) *string { return &s }
	type check struct {
		name   string
		header *string // nil: no header
		want   bool
	}
	checks := []check{
		{"good", str(signature.Sign(secret, now, body)), true},
		{"spaces around the parts", str("t=" + ts + ", v1=" + sig), true},
		{"a second v1 of a rotated secret", str("t=" + ts + ",v1=" + signature.Signature([]byte("the-secret-before-0000"), now.Unix(), body) + ",v1=" + sig), true},
		{"another scheme", str("t=" + ts + ",v0=zz,v1=" + sig), true},
		{"wrong secret", str(signature.Sign([]byte("another-secret-0123456"), now, body)), false},
		{"stale", str(signature.Sign(secret, stale, body)), false},
		{"no header", nil, false},
		{"empty", str(""), false},
		{"garbage", str("garbage"), false},
		{"no timestamp", str("v1=" + sig), false},
		{"no v1", str("t=" + ts), false},
		{"timestamp not a number", str("t=soon,v1=" + sig), false},
		{"timestamp of other digits", str("t=²,v1=" + sig), false},
		{"two timestamps", str("t=" + ts + ",t=" + ts + ",v1=" + sig), false},
		{"v1 not hex", str("t=" + ts + ",v1=xyz"), false},
		{"v1 not ASCII", str("t=" + ts + ",v1=é"), false},
		{"keys without values", str("t,v1"), false},
		{"only separators", str("=,=,,"), false},
	}
	type input struct {
		Secret string  `json:"secret"`
		Header *string `json:"header"`
		Body   string  `json:"body"`
	}
	var in []input
	for _, c := range checks {
		// The Go verifier says the same, for the header it can be given.
		if h := c.header; h != nil {
			if got := signature.Verify(secret, *h, body, now, 5*time.Minute) == nil; got != c.want {
				t.Fatalf("%s: signature.Verify says %v, the case %v", c.name, got, c.want)
			}
		}
		in = append(in, input{base64.StdEncoding.EncodeToString(secret), c.header, base64.StdEncoding.EncodeToString(body)})
	}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", sample.Text+pythonDriver)
	cmd.Stdin = strings.NewReader(string(data))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 with %s: %v\n%s", sample, err, out)
	}
	var got []any
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(checks) {
		t.Fatalf("python3 printed %q: %v, want %d answers", out, err, len(checks))
	}
	for i, c := range checks {
		if got[i] != c.want {
			t.Errorf("%s: verify returned %v, want %v", c.name, got[i], c.want)
		}
	}
}
