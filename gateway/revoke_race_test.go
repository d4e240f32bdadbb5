package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway/internal/socket"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// TestRevokedRacingAFlush: when a revocation races the flush of the
// revoked user's change, the change is never written after the denied
// frame: a flush that took it writes it first, and otherwise it is
// dropped. Each round queues a change of bob and revokes at once, while
// the scheduler flushes the socket on its own goroutines.
func TestRevokedRacingAFlush(t *testing.T) {
	s, err := New(nil, Config{DevAuth: true, BatchInterval: time.Millisecond, BatchPace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, frames := revokeConn(t, s, "alice")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.scheduler.Run(ctx) })
	defer func() {
		cancel()
		wg.Wait()
	}()

	for round := range 200 {
		// As the authorizer does, the hub's subscription is gone before
		// Revoked: nothing of bob is queued after this change.
		c.Deliver(presence.Presence{UserID: "bob", Status: presence.Busy}, 0)
		notifier{s}.Revoked(c, "bob", protocol.ReasonNotMutualFollowers)
		// carol's change, queued after the denied, ends the round.
		c.Deliver(presence.Presence{UserID: "carol", Status: presence.Online}, 0)
		denied := false
		for done := false; !done; {
			var m protocol.ServerMessage
			select {
			case m = <-frames:
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: carol's change was never written", round)
			}
			switch m.Type {
			case protocol.TypeDenied:
				denied = true
			case protocol.TypePresenceBatch:
				for _, p := range m.Updates {
					if p.UserID == "bob" && denied {
						t.Fatalf("round %d: bob's change was written after his denied", round)
					}
					done = done || p.UserID == "carol"
				}
			}
		}
		if !denied {
			t.Fatalf("round %d: carol's change came before bob's denied", round)
		}
	}
}

// revokeConn returns a connection of s whose socket is one end of a
// loopback TCP connection, and the frames read from the other end, until
// the test ends.
func revokeConn(t *testing.T, s *Service, userID string) (*conn, <-chan protocol.ServerMessage) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	frames, done := make(chan protocol.ServerMessage), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		r := bufio.NewReader(client)
		for {
			h, err := ws.ReadHeader(r)
			if err != nil {
				return
			}
			payload := make([]byte, h.Length) // the gateway's own frames: small
			if _, err := io.ReadFull(r, payload); err != nil {
				return
			}
			var m protocol.ServerMessage
			if err := json.Unmarshal(payload, &m); err != nil {
				t.Errorf("undecodable frame %q: %v", payload, err)
				return
			}
			select {
			case frames <- m:
			case <-done:
				return
			}
		}
	})
	t.Cleanup(func() {
		close(done)
		_ = server.Close()
		_ = client.Close()
		wg.Wait()
	})
	c := s.newConn(identity{userID: userID})
	c.sock = socket.New(server, s.cfg.WriteTimeout)
	return c, frames
}
