package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/system/systest"
)

// TestSubscribeChurn: sockets that subscribe to users and unsubscribe
// again, over and over, while those users' states keep changing, each see
// every user's last state once they stay subscribed; and once they have
// all unsubscribed or closed, the gateway watches nobody and holds no
// NATS subscription of theirs.
func TestSubscribeChurn(t *testing.T) {
	t.Parallel()
	const (
		nTargets  = 4
		nWatchers = 6
		cycles    = 30
		changes   = 40
	)
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{RateLimit: 1000, RateBurst: 1000}})
	gw := sys.Gateway()
	var targets, watchers []string
	for i := range nTargets {
		targets = append(targets, fmt.Sprint("t", i))
	}
	for i := range nWatchers {
		watchers = append(watchers, fmt.Sprint("w", i))
	}
	sys.Mutual(append(targets, watchers...)...)
	tconns := make([]*client.Conn, nTargets)
	for i, u := range targets {
		tconns[i] = sys.Dial(gw, u)
		t.Cleanup(systest.KeepAlive(tconns[i], systest.Heartbeat))
	}
	wconns := make([]*client.Conn, nWatchers)
	for i, u := range watchers {
		wconns[i] = sys.Dial(gw, u)
		t.Cleanup(systest.KeepAlive(wconns[i], systest.Heartbeat))
	}
	baseline := gw.NATSSubscriptions()

	// The targets change their status while the watchers come and go,
	// then each watcher subscribes to all of them for good.
	var changing errgroup.Group
	for _, c := range tconns {
		changing.Go(func() error {
			for i := range changes {
				if err := c.SetStatus([]string{"busy", "online"}[i%2]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	var churning errgroup.Group
	for w, c := range wconns {
		churning.Go(func() error {
			for i := range cycles {
				// A window of targets, moving on each cycle.
				sub := []string{targets[(w+i)%nTargets], targets[(w+i+1)%nTargets]}
				if err := subscribeAndWait(c, fmt.Sprint("c", i), sub); err != nil {
					return err
				}
				if err := c.Send(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, ID: fmt.Sprint("u", i), UserIDs: sub[:1+i%2]}); err != nil {
					return err
				}
			}
			return subscribeAndWait(c, "final", targets)
		})
	}
	if err := churning.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := changing.Wait(); err != nil {
		t.Fatal(err)
	}
	for _, c := range tconns {
		if err := c.SetStatus("away"); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range wconns {
		v := systest.NewView(t, c)
		v.Until(systest.EventTimeout, watchers[i]+" sees every target away", func(v *systest.View) bool {
			for _, u := range targets {
				if p, _ := v.Presence(u); p.Status != presence.Away {
					return false
				}
			}
			return true
		})
	}
	if n := gw.WatchedUsers(); n != nTargets {
		t.Fatalf("the gateway watches %d users, want %d", n, nTargets)
	}

	// Half the watchers unsubscribe, the others close.
	for i, c := range wconns {
		var err error
		if i%2 == 0 {
			err = c.Send(protocol.ClientMessage{Type: protocol.TypeUnsubscribe, ID: "end", UserIDs: targets})
		} else {
			err = c.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, systest.EventTimeout, 10*time.Millisecond, func() error {
		if n, subs := gw.WatchedUsers(), gw.NATSSubscriptions(); n != 0 || subs != baseline {
			return fmt.Errorf("the gateway watches %d users with %d NATS subscriptions, want none and %d", n, subs, baseline)
		}
		return nil
	})
}

// subscribeAndWait subscribes c to users and reads its frames until the
// presence_init that answers, which must show each of them.
func subscribeAndWait(c *client.Conn, id string, users []string) error {
	if err := c.Subscribe(id, users...); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(systest.EventTimeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	for {
		m, raw, err := c.Read()
		switch {
		case err != nil:
			return fmt.Errorf("waiting for presence_init %s: %w", id, err)
		case m.Type == protocol.TypeError || m.Type == protocol.TypeDenied:
			return fmt.Errorf("waiting for presence_init %s: %s", id, raw)
		case m.Type == protocol.TypePresenceInit && m.ID == id:
			if len(m.Users) != len(users) {
				return fmt.Errorf("presence_init %s shows %d users, want %d: %s", id, len(m.Users), len(users), raw)
			}
			return nil
		}
	}
}
