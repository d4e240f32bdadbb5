package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/tooltest"
	"github.com/greendot/greendot/pkg/presence"
)

// TestWorkersKilled runs reapers and fanouts as child processes, sharing
// their durable consumers, on a three-node cluster. A reaper and a fanout
// hang (SIGSTOP) while users leave and change status and a gateway holding
// other users dies (SIGKILL), so the server hands them work they never
// acknowledge: the end of the dead gateway's lease, and status revisions;
// then both are killed. The survivors (a second reaper starts only once the
// first holds the lease's end) must carry every transition through: what
// the dead instances held is redelivered after --ack-wait, handled again
// (compare-and-set makes a second handling a no-op, and gateways drop
// events that are not newer than what they have), and every watcher ends up
// seeing the truth, with nothing out of order and no connected user shown
// offline. Then the survivors alone handle a second round.
func TestWorkersKilled(t *testing.T) {
	tooltest.Long(t)
	cl := startCluster(t, 3)
	store := cl.openStore(3)
	tm := timings{ttl: time.Second, heartbeat: 300 * time.Millisecond, grace: time.Second, ackWait: 2 * time.Second, replicas: 3,
		sweep: time.Hour}
	hungReaper := startChildWorker(t, cl, "reaper", "reaper1", tm)
	hungFanout := startChildWorker(t, cl, "fanout", "fanout1", tm)
	startChildWorker(t, cl, "fanout", "fanout2", tm)
	gw := startGateway(t, cl.urlsAs("gateway"), "gw", tm)
	doomed, doomedWS := startChildGateway(t, cl, "doomed", tm)

	steady, leavers, stranded, watcherIDs := names("s", 4), names("l", 8), names("d", 4), names("w", 2)
	users := append(append([]string{}, steady...), leavers...)
	mutual(t, store, watcherIDs, append(append(users, stranded...), "n0"))
	var watchers []*liveClient
	for _, id := range watcherIDs {
		watchers = append(watchers, dialClient(t, id, []string{gw.WS}, tm.heartbeat, false))
	}
	clients := map[string]*liveClient{}
	changes := map[string][]change{}
	for _, u := range users {
		changes[u] = []change{{time.Now(), presence.Online}}
		clients[u] = dialClient(t, u, []string{gw.WS}, tm.heartbeat, false)
	}
	for _, u := range stranded {
		changes[u] = []change{{time.Now(), presence.Online}}
		clients[u] = dialClient(t, u, []string{doomedWS}, tm.heartbeat, false)
	}
	for _, w := range watchers {
		w.subscribe(append(append(users, stranded...), "n0")...)
	}
	want := truth{"n0": presence.Offline}
	for _, u := range append(users, stranded...) {
		want[u] = presence.Online
	}
	expectViews(t, 15*time.Second, "everyone online", watchers, want)
	watching := time.Now()

	// Round one: reaper1 and fanout1 hang while users leave (half close
	// cleanly, half vanish) and the others change status.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	held := watchHeld(ctx, store.JetStream())
	hungReaper.Signal(syscall.SIGSTOP)
	hungFanout.Signal(syscall.SIGSTOP)
	// The doomed gateway dies with its users' sockets: its lease ends
	// after its TTL, and the only reaper, hung, is handed the end.
	kill(t, doomed)
	for _, u := range stranded {
		clients[u].abort()
		want[u] = presence.Offline
	}
	waitFor(t, 30*time.Second, "the hung reaper holds the end of the doomed gateway's lease", func() error {
		info, err := consumerInfo(ctx, store.JetStream(), presence.StreamName(presence.LeasesBucket), presence.ReaperConsumer)
		if err != nil {
			return err
		}
		if info.NumAckPending == 0 {
			return fmt.Errorf("nothing handed out yet: %d pending", info.NumPending)
		}
		return nil
	})
	startChildWorker(t, cl, "reaper", "reaper2", tm)
	for i, u := range leavers {
		if i%2 == 0 {
			clients[u].close()
		} else {
			clients[u].abort()
		}
		want[u] = presence.Offline
	}
	setAll(t, clients, steady, presence.Busy, changes, want)
	waitFor(t, 30*time.Second, "hung workers held revisions they never acknowledged", held.check)
	held.stop()
	kill(t, hungReaper)
	kill(t, hungFanout)
	// Only redelivery brings their share back: the reapers' periodic sweep
	// does not run again within this test.
	expectViews(t, 30*time.Second, "round one seen through the survivors", watchers, want)

	// Round two: the survivors alone.
	setAll(t, clients, steady, presence.Away, changes, want)
	n0 := dialClient(t, "n0", []string{gw.WS}, tm.heartbeat, false)
	want["n0"] = presence.Online
	expectViews(t, 15*time.Second, "round two: n0 online", watchers, want)
	n0.close()
	want["n0"] = presence.Offline
	setAll(t, clients, steady, presence.Online, changes, want)
	expectViews(t, 15*time.Second, "round two seen", watchers, want)

	end := time.Now()
	neverOffline(t, watchers, steady, watching, end)
	t.Logf("presences told again unchanged: %d", repeats(watchers, steady, watching))
	for _, w := range watchers {
		for _, u := range steady {
			inOrder(t, w, u, watching, changes[u])
		}
	}
	for _, u := range append(append(leavers, stranded...), "n0") {
		rec, _, err := store.Status(ctx, u)
		if err != nil || rec.Status != presence.Offline || len(rec.Conns) != 0 {
			t.Errorf("record of %s: %+v, %v", u, rec, err)
		}
	}

	// Applied once in effect: however often the end of a leaver's
	// connection was handed out, its record went offline in one revision,
	// and nothing was written after it.
	kv, err := store.JetStream().KeyValue(ctx, presence.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range append(leavers, stranded...) {
		hist, err := kv.History(ctx, presence.StatusKey(u))
		if err != nil {
			t.Fatalf("history of %s: %v", u, err)
		}
		var statuses []presence.Status
		for _, e := range hist {
			var rec presence.Record
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				t.Fatalf("revision %d of %s: %v", e.Revision(), u, err)
			}
			statuses = append(statuses, rec.Status)
		}
		if n := len(statuses); n == 0 || statuses[n-1] != presence.Offline || slices.Index(statuses, presence.Offline) != n-1 {
			t.Errorf("revisions of %s: %v; want it to go offline once, in the last one", u, statuses)
		}
	}
}

// setAll makes users choose st at once, waits for every confirmation, and
// notes the change.
func setAll(tb testing.TB, clients map[string]*liveClient, users []string, st presence.Status, changes map[string][]change, want truth) {
	tb.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(users))
	for _, u := range users {
		changes[u] = append(changes[u], change{time.Now(), st})
		want[u] = st.Public()
		wg.Go(func() {
			if err := clients[u].setStatus(st, 30*time.Second); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Error(err)
	}
	if tb.Failed() {
		tb.FailNow()
	}
}

// heldWork watches the reaper and fanout consumers, and notes when one of
// them held a revision that an instance did not acknowledge: the server
// redelivered it, or it stayed pending over two looks. The survivors
// acknowledge theirs within milliseconds, so that is the hung instances'
// share. Watching all the time, rather than looking once, sees it even when
// the redelivery came and went before the test looked.
type heldWork struct {
	mu     sync.Mutex
	seen   map[string]bool
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

func watchHeld(ctx context.Context, js jetstream.JetStream) *heldWork {
	ctx, cancel := context.WithCancel(ctx)
	h := &heldWork{seen: map[string]bool{}, cancel: cancel, done: make(chan struct{})}
	consumers := []struct{ stream, consumer string }{
		{presence.StreamName(presence.LeasesBucket), presence.ReaperConsumer},
		{presence.StreamName(presence.StatusBucket), presence.FanoutConsumer},
	}
	go func() {
		defer close(h.done)
		pending := map[string]int{}
		for ctx.Err() == nil {
			for _, c := range consumers {
				info, err := consumerInfo(ctx, js, c.stream, c.consumer)
				h.mu.Lock()
				switch {
				case err != nil:
					h.err = err
				case info.NumRedelivered > 0 || info.NumAckPending > 0 && pending[c.consumer] > 0:
					h.seen[c.consumer] = true
				}
				h.mu.Unlock()
				if err == nil {
					pending[c.consumer] = info.NumAckPending
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return h
}

// check reports an error until both consumers were seen holding work.
func (h *heldWork) check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range []string{presence.ReaperConsumer, presence.FanoutConsumer} {
		if !h.seen[c] {
			return fmt.Errorf("no unacknowledged revision seen on %s (last error: %v)", c, h.err)
		}
	}
	return nil
}

func (h *heldWork) stop() {
	h.cancel()
	<-h.done
}

// consumerInfo reads a durable consumer's state.
func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, consumer string) (*jetstream.ConsumerInfo, error) {
	c, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", consumer, err)
	}
	return c.Info(ctx)
}
