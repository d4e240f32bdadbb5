// Package apikeys reads the keys a backend calls the gateway's server API
// with: a file of named keys, each with its scopes, read again when it
// changes, so that a key is rotated by adding the new one, moving the
// backend to it, and removing the old.
//
// The file has one key per line, its name, its scopes (comma-separated)
// and the key, or "sha256:" and the hex of the key's SHA-256; blank lines
// and lines starting with # are ignored:
//
//	# name   scopes                      key
//	calls    status:write                sha256:5e884898da28047151d0e56f8dc62927...
//	billing  presence:read,status:write  gdk_2c1b0f7e9d8a4c6b3e5f7a9c1d3e5f7a
package apikeys

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Scope is what a key may do.
type Scope string

// The scopes.
const (
	// PresenceRead reads the presence of any user and the members of any
	// room.
	PresenceRead Scope = "presence:read"
	// StatusWrite sets any user's chosen status and custom status.
	StatusWrite Scope = "status:write"
)

// Scopes are every scope, in the order they are documented.
var Scopes = []Scope{PresenceRead, StatusWrite}

// Limits of the file.
const (
	MaxFileBytes = 1 << 20
	MaxKeys      = 1000
	// MinKeyLen is the shortest key given as itself.
	MinKeyLen = 24
)

// Key is one key of the file.
type Key struct {
	// Name names the key in logs and metrics.
	Name   string
	Scopes []Scope
	hash   [sha256.Size]byte
}

// Allows reports whether k has scope.
func (k *Key) Allows(scope Scope) bool { return slices.Contains(k.Scopes, scope) }

// Set is the keys of a file, as last read.
type Set struct {
	path string
	keys atomic.Pointer[map[[sha256.Size]byte]*Key]
	// stat is the size and modification time of the file as last read.
	stat atomic.Pointer[fileStat]
}

type fileStat struct {
	size int64
	mod  time.Time
}

// Open reads the file at path; its errors say the line and what is
// wrong with it.
func Open(path string) (*Set, error) {
	s := &Set{path: path}
	if _, err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Lookup returns the key whose secret is key, if any.
func (s *Set) Lookup(key string) (*Key, bool) {
	k, ok := (*s.keys.Load())[sha256.Sum256([]byte(key))]
	return k, ok
}

// Len is how many keys the set has.
func (s *Set) Len() int { return len(*s.keys.Load()) }

// Reload reads the file again if its size or modification time changed
// since it was last read, and reports whether it did. A file that cannot
// be read, or holds a bad line, leaves the keys as they were.
func (s *Set) Reload() (bool, error) {
	fi, err := os.Stat(s.path)
	if err != nil {
		return false, fmt.Errorf("API keys: %w", err)
	}
	st := &fileStat{size: fi.Size(), mod: fi.ModTime()}
	if last := s.stat.Load(); last != nil && *last == *st {
		return false, nil
	}
	if fi.Size() > MaxFileBytes {
		return false, fmt.Errorf("API keys %s: %d bytes, at most %d", s.path, fi.Size(), MaxFileBytes)
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return false, fmt.Errorf("API keys: %w", err)
	}
	keys, err := Parse(data)
	if err != nil {
		return false, fmt.Errorf("API keys %s: %w", s.path, err)
	}
	s.keys.Store(&keys)
	s.stat.Store(st)
	return true, nil
}

// Parse reads the keys of a file's contents.
func Parse(data []byte) (map[[sha256.Size]byte]*Key, error) {
	keys := make(map[[sha256.Size]byte]*Key)
	names := make(map[string]bool)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxFileBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		switch {
		case names[k.Name]:
			return nil, fmt.Errorf("line %d: key %q named twice", n, k.Name)
		case keys[k.hash] != nil:
			return nil, fmt.Errorf("line %d: key %q is key %q again", n, k.Name, keys[k.hash].Name)
		case len(keys) == MaxKeys:
			return nil, fmt.Errorf("line %d: more than %d keys", n, MaxKeys)
		}
		names[k.Name], keys[k.hash] = true, k
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return keys, nil
}

func parseLine(line string) (*Key, error) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return nil, errors.New("want a name, its scopes and the key (or sha256:<hex>), separated by spaces")
	}
	k := &Key{Name: f[0]}
	if !validName(k.Name) {
		return nil, fmt.Errorf("name %q: want 1 to 64 of A-Z a-z 0-9 _ - and dots", k.Name)
	}
	for _, sc := range strings.Split(f[1], ",") {
		if !slices.Contains(Scopes, Scope(sc)) {
			return nil, fmt.Errorf("key %q: scope %q: want %s", k.Name, sc, scopeNames())
		}
		if !k.Allows(Scope(sc)) {
			k.Scopes = append(k.Scopes, Scope(sc))
		}
	}
	switch secret := f[2]; {
	case strings.HasPrefix(secret, "sha256:"):
		b, err := hex.DecodeString(strings.TrimPrefix(secret, "sha256:"))
		if err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("key %q: sha256: wants the %d hex digits of the key's SHA-256", k.Name, 2*sha256.Size)
		}
		copy(k.hash[:], b)
	case len(secret) < MinKeyLen:
		return nil, fmt.Errorf("key %q: %d characters, at least %d (or sha256:<hex>)", k.Name, len(secret), MinKeyLen)
	default:
		k.hash = sha256.Sum256([]byte(secret))
	}
	return k, nil
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func scopeNames() string {
	names := make([]string, len(Scopes))
	for i, s := range Scopes {
		names[i] = string(s)
	}
	return strings.Join(names, " or ")
}
