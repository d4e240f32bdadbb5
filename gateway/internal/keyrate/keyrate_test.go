package keyrate

import (
	"fmt"
	"testing"
	"time"
)

func TestBurstThenRefill(t *testing.T) {
	l := New(2, 3)
	now := time.Unix(1_000, 0)
	for i := range 3 {
		if ok, _ := l.Allow("alice", now); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	ok, wait := l.Allow("alice", now)
	if ok {
		t.Fatal("request beyond the burst allowed")
	}
	if wait != 500*time.Millisecond {
		t.Fatalf("wait = %v, want 500ms (one token at 2/s)", wait)
	}
	if ok, _ := l.Allow("bob", now); !ok {
		t.Fatal("another key was limited by alice's requests")
	}
	if ok, _ := l.Allow("alice", now.Add(499*time.Millisecond)); ok {
		t.Fatal("allowed before the token was back")
	}
	if ok, _ := l.Allow("alice", now.Add(500*time.Millisecond)); !ok {
		t.Fatal("refused once the token was back")
	}
}

func TestRefusalsTakeNoToken(t *testing.T) {
	l := New(1, 1)
	now := time.Unix(1_000, 0)
	l.Allow("k", now)
	for range 10 {
		l.Allow("k", now.Add(100*time.Millisecond))
	}
	if ok, _ := l.Allow("k", now.Add(time.Second)); !ok {
		t.Fatal("refused requests delayed the next token")
	}
}

func TestIdleKeysAreForgotten(t *testing.T) {
	l := New(10, 1)
	now := time.Unix(1_000, 0)
	for i := range sweepEvery - 1 {
		l.Allow(fmt.Sprint("idle-", i), now)
	}
	l.Allow("busy", now.Add(time.Second))
	// The sweep came with the key that made sweepEvery: every key idle
	// for a second has a full bucket again and is forgotten, but the
	// busy one, which has just taken its token.
	if n := l.Len(); n != 1 {
		t.Fatalf("%d keys kept after the sweep, want 1", n)
	}
	if ok, _ := l.Allow("busy", now.Add(time.Second)); ok {
		t.Fatal("the busy key's bucket was forgotten while empty")
	}
}
