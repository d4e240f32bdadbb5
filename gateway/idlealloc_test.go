package gateway_test

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/system/systest"
)

// TestIdleHeartbeatsAllocateNothing: reading the heartbeats of idle
// connections through the poller (the wake-up, the read, the decode) does
// not allocate, so that a gateway holding many idle connections leaves its
// heap alone and its collector idle. It counts the allocations of the whole
// process (the NATS server runs in it too, refreshing the gateway's lease)
// while real sockets send heartbeats. About a tenth of one per heartbeat is
// what else runs meanwhile, more on a slow machine; the goroutine and
// closures the path had for each heartbeat made it about six. Under one
// per heartbeat, the path allocates nothing.
func TestIdleHeartbeatsAllocateNothing(t *testing.T) {
	sys := systest.Start(t, systest.Options{
		Gateway:  gateway.Config{ConnTTL: 10 * time.Minute, HeartbeatInterval: 5 * time.Minute},
		NoReaper: true,
		NoFanout: true,
	})
	gw := sys.Gateway()
	const conns, rounds = 500, 20
	cs := make([]*client.Conn, conns)
	for i := range cs {
		cs[i] = sys.Dial(gw, fmt.Sprintf("idle%03d", i))
	}
	var b bytes.Buffer
	if err := ws.WriteFrame(&b, ws.MaskFrame(ws.NewTextFrame([]byte(`{"type":"heartbeat"}`)))); err != nil {
		t.Fatal(err)
	}
	frame := b.Bytes()
	round := func() {
		t.Helper()
		want := gw.Heartbeats() + conns
		for _, c := range cs {
			if err := c.WriteBytes(frame); err != nil {
				t.Fatal(err)
			}
		}
		natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			if got := gw.Heartbeats(); got < want {
				return fmt.Errorf("the gateway read %v heartbeats, want %v", got, want)
			}
			return nil
		})
	}
	round() // the readers start, and the pools fill
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range rounds {
		round()
	}
	runtime.ReadMemStats(&after)
	per := float64(after.Mallocs-before.Mallocs) / (conns * rounds)
	t.Logf("%.3f allocations and %.1f bytes per heartbeat", per, float64(after.TotalAlloc-before.TotalAlloc)/(conns*rounds))
	if per >= 1 {
		t.Errorf("%.2f allocations per heartbeat, want none", per)
	}
}
