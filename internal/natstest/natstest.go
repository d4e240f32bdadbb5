// Package natstest runs real, embedded NATS servers with JetStream for
// greendot's tests.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// RunServer starts a NATS server with JetStream on a random loopback port,
// storing in a temporary directory. It is shut down when the test ends.
func RunServer(tb testing.TB) *server.Server {
	tb.Helper()
	return RunServerWithOptions(tb, &server.Options{})
}

// RunServerWithOptions starts a server like RunServer, with opts as the
// starting point: Host, Port, JetStream and StoreDir are filled in when
// empty.
func RunServerWithOptions(tb testing.TB, opts *server.Options) *server.Server {
	tb.Helper()
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Port == 0 {
		opts.Port = -1
	}
	opts.JetStream = true
	if opts.StoreDir == "" {
		opts.StoreDir = tb.TempDir()
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		tb.Fatal("nats server did not start")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Connect connects to s; the connection is closed when the test ends.
func Connect(tb testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		tb.Fatalf("connect to nats: %v", err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// CheckFor calls f until it returns nil or total passes, sleeping delay
// between calls, and fails the test with f's last error if it never succeeds.
func CheckFor(tb testing.TB, total, delay time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(delay)
	}
	tb.Fatalf("condition not met after %v: %v", total, err)
}
