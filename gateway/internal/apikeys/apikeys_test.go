package apikeys_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway/internal/apikeys"
)

const (
	readerKey = "gdk_reader_0123456789abcdef"
	writerKey = "gdk_writer_0123456789abcdef"
)

func hashed(key string) string {
	h := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(h[:])
}

func TestParse(t *testing.T) {
	t.Parallel()
	keys, err := apikeys.Parse([]byte("# name scopes key\n\nreader presence:read " + readerKey + "\n  writer  status:write,presence:read,status:write  " + hashed(writerKey) + "  \n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("%d keys, want 2", len(keys))
	}
	for _, tc := range []struct {
		name, text, says string
	}{
		{"two fields", "reader presence:read", "line 1: want a name, its scopes and the key"},
		{"bad name", "rea/der presence:read " + readerKey, `line 1: name "rea/der"`},
		{"bad scope", "reader presence:write " + readerKey, `line 1: key "reader": scope "presence:write": want presence:read or status:write`},
		{"short key", "reader presence:read short", `key "reader": 5 characters, at least 24`},
		{"bad hash", "reader presence:read sha256:abcd", "wants the 64 hex digits"},
		{"a name twice", "reader presence:read " + readerKey + "\nreader status:write " + writerKey, `line 2: key "reader" named twice`},
		{"a key twice", "reader presence:read " + readerKey + "\nother status:write " + hashed(readerKey), `line 2: key "other" is key "reader" again`},
	} {
		if _, err := apikeys.Parse([]byte(tc.text)); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.says)
		}
	}
}

// TestReload: a key set follows its file: a key added is taken, one
// removed refused; a file gone bad keeps the keys before.
func TestReload(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "keys")
	write := func(text string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		// A new modification time, however fast the test runs.
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Unix(1_800_000_000, 0)
	write("reader presence:read "+readerKey+"\n", at)
	set, err := apikeys.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := set.Lookup(readerKey); !ok || k.Name != "reader" || !k.Allows(apikeys.PresenceRead) || k.Allows(apikeys.StatusWrite) {
		t.Fatalf("reader: %+v %v", k, ok)
	}
	if changed, err := set.Reload(); changed || err != nil {
		t.Errorf("Reload of an unchanged file: %v %v", changed, err)
	}
	// Rotation: the new key beside the old, then the old removed.
	write("reader presence:read "+readerKey+"\nreader2 presence:read "+writerKey+"\n", at.Add(time.Second))
	if changed, err := set.Reload(); !changed || err != nil || set.Len() != 2 {
		t.Fatalf("Reload with a key added: %v %v, %d keys", changed, err, set.Len())
	}
	write("reader2 presence:read "+writerKey+"\n", at.Add(2*time.Second))
	if _, err := set.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := set.Lookup(readerKey); ok {
		t.Error("a key removed from the file still taken")
	}
	write("reader2 presence:write "+writerKey+"\n", at.Add(3*time.Second))
	if _, err := set.Reload(); err == nil || !strings.Contains(err.Error(), `scope "presence:write"`) {
		t.Errorf("Reload of a bad file: %v", err)
	}
	if _, ok := set.Lookup(writerKey); !ok {
		t.Error("a bad file dropped the keys before it")
	}
	if _, err := apikeys.Open(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("Open of a missing file: no error")
	}
}
