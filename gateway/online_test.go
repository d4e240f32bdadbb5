package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/systest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// TestEveryoneReadAgainAfterReconnect: under the everyone policy, a change
// a gateway missed (here a status record written with no event and no
// fanout to publish it) is found when the gateway reads every record again
// on getting its NATS connection back, and the sockets watching everyone
// are told.
func TestEveryoneReadAgainAfterReconnect(t *testing.T) {
	sys := systest.Start(t, systest.Options{
		Gateway:  gateway.Config{Policy: gateway.PolicyEveryone},
		NoFanout: true,
		NoReaper: true, // carol's connection below has no lease behind it
	})
	gw := sys.Gateway()
	dave := sys.Dial(gw, "dave", "web")
	defer systest.KeepAlive(dave, systest.Heartbeat)()
	watchEveryone(t, dave)

	_, _, _, err := sys.Store.UpdateStatus(context.Background(), "carol", func(r *presence.Record) error {
		r.SetConn("elsewhere", presence.ConnInfo{Gateway: "gw-other", Lease: "E1", Since: time.Now().UnixMilli()})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cutNATS(t, sys, gw)
	// The client reconnects within about a second; on a loaded machine
	// the read that follows may fail and be tried again.
	systest.Await(t, dave, 4*systest.EventTimeout, "carol online, found by reading again", func(m protocol.ServerMessage) bool {
		if m.Type != protocol.TypePresenceBatch {
			return false
		}
		for _, p := range m.Updates {
			if p.UserID == "carol" && p.Status == presence.Online {
				return true
			}
		}
		return false
	})
}

// watchEveryone subscribes c to every user ("all": true) and returns the
// presence_init that answers it.
func watchEveryone(t *testing.T, c *client.Conn) protocol.ServerMessage {
	t.Helper()
	if err := c.Send(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: "all", All: true}); err != nil {
		t.Fatal(err)
	}
	return systest.Await(t, c, systest.EventTimeout, "presence_init all", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "all"
	})
}
