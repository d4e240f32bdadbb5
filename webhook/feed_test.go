package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/presence"
)

// The recipe of docs/integration.md for a backend that reads the feed
// itself, as nats.go code: the consumer, then the decoding of a message.

// feedConsumer is what
//
//	nats consumer add presence_feed app-backend --pull \
//	  --filter '$KV.presence_status.>' --deliver subject --ack explicit \
//	  --max-pending 1 --max-deliver=-1 --wait 30s --replay instant --defaults
//
// creates.
var feedConsumer = jetstream.ConsumerConfig{
	Durable:       "app-backend",
	FilterSubject: "$KV.presence_status.>",
	DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	AckPolicy:     jetstream.AckExplicitPolicy,
	MaxAckPending: 1,
	MaxDeliver:    -1,
	AckWait:       30 * time.Second,
	ReplayPolicy:  jetstream.ReplayInstantPolicy,
}

// transition is what the documentation's snippet makes of a message.
type transition struct {
	User     string
	Status   string // the true status; Public is what watchers see
	Public   string
	Devices  int
	LastSeen int64 // unix seconds
	Rev      uint64
}

// decodeFeed is the documentation's snippet.
func decodeFeed(msg jetstream.Msg) (transition, error) {
	// The revision in presence_status, which the feed keeps in this
	// header: "KV_presence_status <revision> ...". (The message's own
	// sequence is the feed's.)
	src := strings.Fields(msg.Headers().Get("Nats-Stream-Source"))
	if len(src) < 2 || src[0] != "KV_presence_status" {
		return transition{}, fmt.Errorf("not a presence_status revision: %q", src)
	}
	rev, err := strconv.ParseUint(src[1], 10, 64)
	if err != nil {
		return transition{}, err
	}
	t := transition{
		User: strings.TrimPrefix(msg.Subject(), "$KV.presence_status."),
		Rev:  rev, // only grows, per user too
	}
	switch msg.Headers().Get("KV-Operation") {
	case "DEL", "PURGE": // removed by an operator: offline
		t.Status, t.Public = "offline", "offline"
		return t, nil
	}
	var rec struct {
		Status   string `json:"status"`
		Public   string `json:"public"`
		Devices  int    `json:"devices"`
		LastSeen int64  `json:"last_seen"`
	}
	if err := json.Unmarshal(msg.Data(), &rec); err != nil {
		return t, err
	}
	t.Status, t.Public, t.Devices, t.LastSeen = rec.Status, rec.Public, rec.Devices, rec.LastSeen
	return t, nil
}

// TestFeedRecipe follows the recipe: every revision arrives in order,
// deletions included, and a consumer that stopped resumes after the last
// message it acknowledged, with every revision written meanwhile, more of
// one user's than presence_status keeps.
func TestFeedRecipe(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "presence_feed", feedConsumer)
	if err != nil {
		t.Fatal(err)
	}
	a1 := e.put(t, "alice", "online", 1, 100)
	a2 := e.put(t, "alice", "online", 1, 100) // written again unchanged: it comes too
	b1 := e.put(t, "bob", "invisible", 1, 50)
	if err := e.kv.Delete(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	a3 := e.put(t, "alice", "offline", 0, 300)

	next := func(c jetstream.Consumer) (jetstream.Msg, transition) {
		t.Helper()
		msg, err := c.Next(jetstream.FetchMaxWait(wait))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := decodeFeed(msg)
		if err != nil {
			t.Fatal(err)
		}
		return msg, tr
	}
	var got []string
	for range 3 {
		msg, tr := next(cons)
		got = append(got, fmt.Sprintf("%s %s/%s %d %d @%d", tr.User, tr.Status, tr.Public, tr.Devices, tr.LastSeen, tr.Rev))
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The backend stops here. Meanwhile alice changes more often than
	// presence_status keeps; the backend comes back with the same durable
	// name and gets every revision. These writes are made by hand, as
	// `nats kv put` makes them, which greendot's writers' wait for the
	// feed's copy does not cover: each waits for the copy itself.
	statuses := []presence.Status{presence.Away, presence.Online}
	var more []uint64
	for i := range presence.StatusHistory + 5 {
		more = append(more, e.put(t, "alice", statuses[i%2], 1, 400))
		e.awaitFed(t, "alice", uint64(3+i+1)) // a1, a2, a3 and these
	}
	cons, err = js.Consumer(ctx, "presence_feed", "app-backend")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 + len(more) {
		msg, tr := next(cons)
		got = append(got, fmt.Sprintf("%s %s/%s %d %d @%d", tr.User, tr.Status, tr.Public, tr.Devices, tr.LastSeen, tr.Rev))
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		fmt.Sprintf("alice online/online 1 100 @%d", a1),
		fmt.Sprintf("alice online/online 1 100 @%d", a2),
		fmt.Sprintf("bob invisible/offline 1 50 @%d", b1),
		fmt.Sprintf("carol offline/offline 0 0 @%d", b1+1),
		fmt.Sprintf("alice offline/offline 0 300 @%d", a3),
	}
	for i, rev := range more {
		want = append(want, fmt.Sprintf("alice %s/%s 1 400 @%d", statuses[i%2], statuses[i%2].Public(), rev))
	}
	if !slices.Equal(got, want) {
		t.Errorf("feed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := cons.Next(jetstream.FetchMaxWait(500 * time.Millisecond)); err == nil {
		t.Error("a message after the last revision")
	}
}
