package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
)

// A service that shows as online while it runs, watches two users and
// logs their changes. Heartbeats and reconnects are the Client's work.
func ExampleConnect() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	connectCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := client.Connect(connectCtx, "wss://presence.example.com/ws", client.Config{
		Token:      os.Getenv("GREENDOT_TOKEN"), // a JWT whose sub is the user id
		Device:     "desktop",
		KeepActive: true, // a service: never away for lack of input
	})
	if err != nil {
		log.Fatal(err) // wraps client.ErrRefused for a bad token
	}
	defer c.Close()

	if err := c.Subscribe("alice", "bob"); err != nil {
		log.Fatal(err)
	}
	if err := c.SetStatus(presence.Busy); err != nil {
		log.Fatal(err)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-c.Events():
			if !ok {
				log.Printf("presence client stopped: %v", c.Err())
				return
			}
			switch ev := ev.(type) {
			case client.Snapshot:
				for _, p := range ev.Users {
					log.Printf("%s is %s", p.UserID, p.Status)
				}
			case client.Changes:
				for _, p := range ev.Updates {
					log.Printf("%s is now %s", p.UserID, p.Status)
				}
			case client.Denied:
				log.Printf("may not watch %s: %s", ev.UserID, ev.Reason)
			case client.Disconnected:
				log.Printf("connection lost (%v); next try in %v", ev.Err, ev.Retry)
			case client.Reconnected:
				log.Printf("back after %v; status and subscriptions restored", ev.Down)
			case client.Lagged:
				log.Printf("%d events dropped; catching up from Presence", ev.Dropped)
			}
		}
	}
}

// A test or tool against a local gateway in dev auth (greendot standalone
// on loopback) says who it is with User.
func ExampleConnect_devAuth() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, "ws://127.0.0.1:8080/ws", client.Config{User: "alice"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	h := c.Hello()
	fmt.Printf("connected as %s, heartbeat every %dms\n", h.UserID, h.HeartbeatIntervalMS)
}

// Presence answers from what the client was told, whatever events the
// caller did not read.
func ExampleClient_Presence() {
	ctx := context.Background()
	c, err := client.Connect(ctx, "ws://127.0.0.1:8080/ws", client.Config{User: "bob"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.Subscribe("alice"); err != nil {
		log.Fatal(err)
	}
	for ev := range c.Events() {
		if _, ok := ev.(client.Snapshot); ok {
			break
		}
	}
	if p, ok := c.Presence("alice"); ok {
		fmt.Println("alice is", p.Status)
	}
}

// Err tells why a client stopped on its own.
func ExampleClient_Err() {
	c, err := client.Connect(context.Background(), "ws://127.0.0.1:8080/ws", client.Config{User: "carol"})
	if err != nil {
		log.Fatal(err)
	}
	<-c.Done()
	var he *client.HandshakeError
	var ce *client.CloseError
	switch err := c.Err(); {
	case errors.Is(err, client.ErrClosed):
		fmt.Println("closed by this program")
	case errors.As(err, &he):
		fmt.Println("the gateway refused the upgrade:", he.Status, he.Body)
	case errors.As(err, &ce):
		fmt.Println("the gateway closed with", ce.Code, ce.Reason)
	}
}

// The waits before reconnect attempts are random, up to a bound that
// doubles from Base with every failed attempt and stops at Max.
func ExampleBackoff() {
	b := client.Backoff{Base: 500 * time.Millisecond, Max: 5 * time.Second}
	for attempt := range 6 {
		fmt.Printf("attempt %d waits up to %v\n", attempt, b.Cap(attempt))
	}
	// Output:
	// attempt 0 waits up to 500ms
	// attempt 1 waits up to 1s
	// attempt 2 waits up to 2s
	// attempt 3 waits up to 4s
	// attempt 4 waits up to 5s
	// attempt 5 waits up to 5s
}
