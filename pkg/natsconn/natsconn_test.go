package natsconn

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/internal/natstest"
)

// runServer starts a NATS server on port (-1 for a free one) that admits
// user u with password.
func runServer(t *testing.T, port int, password string) *server.Server {
	t.Helper()
	return natstest.RunServerWithOptions(t, &server.Options{
		Port:  port,
		Users: []*server.User{{Username: "u", Password: password}},
	})
}

// TestReconnectsAfterRefusals cuts a connection off, has the server that
// comes back refuse its credentials again and again, and then accept them:
// the connection is back, not closed for good after the second refusal.
func TestReconnectsAfterRefusals(t *testing.T) {
	first := runServer(t, -1, "right")
	_, portText, err := net.SplitHostPort(first.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		t.Fatal(err)
	}
	refusals := make(chan struct{}, 100)
	nc, err := Connect(Options{
		URL:      first.ClientURL(),
		User:     "u",
		Password: "right",
		Logger:   slog.New(slog.DiscardHandler),
		Extra: []nats.Option{nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrAuthorization) {
				select {
				case refusals <- struct{}{}:
				default:
				}
			}
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	status := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(status)

	// The server comes back with another password: every reconnect is
	// refused.
	first.Shutdown()
	first.WaitForShutdown()
	wrong := runServer(t, port, "changed")
	for i := range 3 {
		select {
		case <-refusals:
		case s := <-status:
			t.Fatalf("after %d reconnects refused: %v (%v), want still reconnecting", i, s, nc.LastError())
		case <-time.After(20 * time.Second):
			t.Fatalf("%d reconnects refused within 20s, want 3; status %v", i, nc.Status())
		}
	}
	wrong.Shutdown()
	wrong.WaitForShutdown()

	// Once the server takes the password again, the connection is back.
	runServer(t, port, "right")
	select {
	case s := <-status:
		if s != nats.CONNECTED {
			t.Fatalf("status %v (%v), want connected again", s, nc.LastError())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("not connected again 20s after the server took the password again; status %v", nc.Status())
	}
}
