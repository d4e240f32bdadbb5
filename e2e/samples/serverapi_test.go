package samples

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// callsKey is the key whose SHA-256 the keys file of docs/integration.md
// gives the calls service.
const callsKey = "gdk_7d3e4f8a6b2c1d0e9f8a7b6c5d4e3f2a"

// TestServerAPISample: the keys file of docs/integration.md is one a
// gateway takes, and its curl command, run with the calls service's key,
// sets alice's custom status, which a watcher sees.
func TestServerAPISample(t *testing.T) {
	t.Parallel()
	keys := doctest.Sample(t, "docs/integration.md", "# name    scopes                       key")
	path := filepath.Join(t.TempDir(), "api-keys")
	if err := os.WriteFile(path, []byte(keys.Text), 0o600); err != nil {
		t.Fatal(err)
	}
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{APIKeysFile: path}})
	gw := sys.Gateway()

	sample := doctest.Sample(t, "docs/integration.md", "curl -X PUT -H \"Authorization: Bearer $CALLS_KEY\"")
	words, err := shellWords(strings.ReplaceAll(strings.ReplaceAll(sample.Text, "\\\n", " "), "$CALLS_KEY", callsKey))
	if err != nil || len(words) != 8 || words[0] != "curl" || words[1] != "-X" || words[3] != "-H" || words[5] != "-d" {
		t.Fatalf("%s is not curl -X <method> -H <header> -d <body> <url>: %q (%v)", sample, words, err)
	}
	url := strings.Replace(words[7], "https://presence.example.com", gw.HTTP, 1)
	req, err := http.NewRequest(words[2], url, strings.NewReader(words[6]))
	if err != nil {
		t.Fatal(err)
	}
	name, value, _ := strings.Cut(words[4], ": ")
	req.Header.Set(name, value)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", sample, resp.Status)
	}
	rec, err := sys.StatusOf("alice")
	if want := (&presence.Custom{Text: "In a call", Emoji: "📞"}); err != nil || !rec.Custom.Equal(want) {
		t.Errorf("%s: alice's custom status %+v (%v), want %+v", sample, rec.Custom, err, want)
	}
	// The other key of the file reads, and may not write.
	if code := call(t, "GET", gw.HTTP+"/api/server/users/alice", "gdk_2c1b0f7e9d8a4c6b3e5f7a9c1d3e5f7a"); code != http.StatusOK {
		t.Errorf("billing's key reads alice: %d", code)
	}
	if code := call(t, "PUT", gw.HTTP+"/api/server/users/alice/status", "gdk_2c1b0f7e9d8a4c6b3e5f7a9c1d3e5f7a"); code != http.StatusForbidden {
		t.Errorf("billing's key writes: %d, want 403", code)
	}
}

func call(t *testing.T, method, url, key string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(`{"status":"busy"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// shellWords splits a command line as sh does one with no escapes and no
// expansions: at spaces outside single and double quotes.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	quote, in := rune(0), false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if in {
				words, in = append(words, w.String()), false
				w.Reset()
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		return nil, errors.New("unclosed quote")
	}
	if in {
		words = append(words, w.String())
	}
	return words, nil
}
