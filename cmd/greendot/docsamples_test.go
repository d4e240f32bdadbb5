package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/system/systest"
	"github.com/greendot/greendot/webhook"
)

// secret is the webhook secret of TestWebhookSamples, which the receiver
// hooks checks.
var secret = []byte("the secret greendot signs webhooks with")

// hooks is the Go receiver of docs/integration.md, line for line.
func hooks(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	err = signature.Verify(secret, r.Header.Get(signature.Header), body, time.Now(), 5*time.Minute)
	if err != nil { // signature.ErrSignatureMismatch, ErrStaleSignature, ...
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var batch webhook.Batch
	if err := json.Unmarshal(body, &batch); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// Store batch.Events, then answer 2xx.
	w.WriteHeader(http.StatusNoContent)
}

// commandOf returns the arguments of the greendot command line of an sh
// block (one command, its lines joined at their trailing backslashes),
// with old and new pairs of replace applied to each.
func commandOf(t *testing.T, b doctest.Block, replace ...string) []string {
	t.Helper()
	words := strings.Fields(strings.ReplaceAll(b.Text, "\\\n", " "))
	if len(words) < 2 || words[0] != "greendot" {
		t.Fatalf("%s is not one greendot command: %q", b, b.Text)
	}
	r := strings.NewReplacer(replace...)
	for i := range words {
		words[i] = r.Replace(words[i])
	}
	return words[1:]
}

// delivery is a request the webhook endpoint got, and how hooks answered.
type delivery struct {
	method, path string
	header       http.Header
	body         []byte
	code         int
}

// codeWriter notes the status a handler writes.
type codeWriter struct {
	http.ResponseWriter
	code int
}

func (w *codeWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// TestWebhookSamples runs the webhook samples of docs/integration.md: the
// feed's creation (greendot buckets --feed --feed-max-age 72h), then the
// webhooks command, with this test's NATS server, endpoint and secret file
// in place of the page's. A user going online is delivered to the page's
// Go receiver (hooks), which takes it, in a request of the page's shape.
func TestWebhookSamples(t *testing.T) {
	doctest.Verbatim(t, doctest.Sample(t, "docs/integration.md", "func hooks(w http.ResponseWriter"), "docsamples_test.go")
	srv := natstest.RunServer(t)
	t.Setenv("GREENDOT_NATS_URL", srv.ClientURL())
	buckets := doctest.Sample(t, "docs/integration.md", "greendot buckets --feed --feed-max-age 72h")
	if code, _, stderr := runOnce(t, commandOf(t, buckets)...); code != 0 {
		t.Fatalf("%s: exit %d\n%s", buckets, code, stderr)
	}
	js, err := jetstream.New(natstest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	feed, err := js.Stream(context.Background(), presence.FeedStream)
	if err != nil || feed.CachedInfo().Config.MaxAge != 72*time.Hour {
		t.Fatalf("after %s: %s: %v, want a max age of 72h", buckets, presence.FeedStream, err)
	}

	var (
		mu  sync.Mutex
		got []delivery
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		cw := &codeWriter{ResponseWriter: w, code: http.StatusOK}
		hooks(cw, r)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, delivery{r.Method, r.URL.Path, r.Header.Clone(), body, cw.code})
	}))
	defer receiver.Close()
	secretFile := filepath.Join(t.TempDir(), "webhook-secret")
	if err := os.WriteFile(secretFile, append(secret, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := doctest.Sample(t, "docs/integration.md", "greendot webhooks --nats-url")
	hooksProc := start(t, commandOf(t, cmd,
		"nats://nats:4222", srv.ClientURL(),
		"https://api.example.com", receiver.URL,
		"/run/secrets/webhook-secret", secretFile)...)
	gwAddr := freeAddr(t)
	start(t, append([]string{"gateway", "--nats-url", srv.ClientURL(), "--listen", gwAddr, "--dev-auth"}, fast...)...)
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if code, body := getQuiet("http://" + gwAddr + "/readyz"); code != http.StatusOK {
			return &statusError{code, body}
		}
		return nil
	})
	alice := dial(t, "ws://"+gwAddr+"/ws?user=alice", client.Options{})
	defer systest.KeepAlive(alice, 300*time.Millisecond)()

	var d delivery
	natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) == 0 {
			return errNoDelivery{hooksProc.stderr.String()}
		}
		d = got[0]
		return nil
	})
	if d.code != http.StatusNoContent {
		t.Errorf("the page's receiver answered %d, want 204: %s", d.code, d.body)
	}

	// The request is as the page shows one.
	sample := doctest.Sample(t, "docs/integration.md", "POST /hooks/presence HTTP/1.1")
	sc := bufio.NewScanner(strings.NewReader(sample.Text))
	sc.Scan()
	if method, path, _ := strings.Cut(sc.Text(), " "); d.method != method || d.path+" HTTP/1.1" != path {
		t.Errorf("%s shows %q; the receiver got %s %s", sample, sc.Text(), d.method, d.path)
	}
	shapes := map[string]*regexp.Regexp{
		"User-Agent":         regexp.MustCompile(`^greendot-webhooks/\S+$`),
		"Greendot-Signature": regexp.MustCompile(`^t=\d+,v1=[0-9a-f]{64}$`),
	}
	for sc.Scan() && sc.Text() != "" {
		name, value, _ := strings.Cut(sc.Text(), ": ")
		if re := shapes[name]; re != nil && !re.MatchString(value) || re == nil && d.header.Get(name) != value {
			t.Errorf("%s shows %s: %s; the receiver got %q", sample, name, value, d.header.Get(name))
		}
		if re := shapes[name]; re != nil && !re.MatchString(d.header.Get(name)) {
			t.Errorf("%s: the receiver got %s: %q, not of the shape %v", sample, name, d.header.Get(name), re)
		}
	}
	var rest strings.Builder
	for sc.Scan() {
		rest.WriteString(sc.Text() + "\n")
	}
	var shown, sent struct{ Events []map[string]any }
	if err := json.Unmarshal([]byte(rest.String()), &shown); err != nil || len(shown.Events) == 0 {
		t.Fatalf("%s: the body is not a batch: %v", sample, err)
	}
	if err := json.Unmarshal(d.body, &sent); err != nil || len(sent.Events) == 0 {
		t.Fatalf("the receiver got %s: %v", d.body, err)
	}
	fields := slices.Sorted(maps.Keys(shown.Events[0]))
	for _, ev := range sent.Events {
		for k := range ev {
			if !slices.Contains(fields, k) {
				t.Errorf("an event has the field %q, which %s does not show (it shows %v)", k, sample, fields)
			}
		}
		for _, k := range []string{"user_id", "status", "devices", "rev", "at"} {
			if _, ok := ev[k]; !ok {
				t.Errorf("an event lacks %q: %v", k, ev)
			}
		}
	}
	if ev := sent.Events[0]; ev["user_id"] != "alice" || ev["status"] != "online" {
		t.Errorf("the first event is %v, want alice online", ev)
	}
}

// errNoDelivery is the wait for the first delivery, with what the
// webhooks process logged.
type errNoDelivery struct{ stderr string }

func (e errNoDelivery) Error() string {
	return "no delivery yet; the webhooks process logged:\n" + e.stderr
}
