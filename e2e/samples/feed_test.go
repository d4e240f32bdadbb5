package samples

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// stored is what the feed sample stores of a message.
type stored struct {
	user, status string
	devices      int
	lastSeen     int64
	rev          uint64
}

// follow is the feed sample of docs/integration.md, line for line, until
// done is closed.
func follow(ctx context.Context, js jetstream.JetStream, store func(user, status string, devices int, lastSeen int64, rev uint64) error, done <-chan struct{}) error {
	cons, err := js.CreateOrUpdateConsumer(ctx, "presence_feed", jetstream.ConsumerConfig{
		Durable:       "app-backend",
		FilterSubject: "$KV.presence_status.>",
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: 1,
		MaxDeliver:    -1,
		AckWait:       30 * time.Second,
	})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		user := strings.TrimPrefix(msg.Subject(), "$KV.presence_status.")
		// The revision in presence_status, which the feed keeps in this
		// header: "KV_presence_status <revision> ...". It only grows, for
		// every user. (The message's own sequence is the feed's.)
		src := strings.Fields(msg.Headers().Get("Nats-Stream-Source"))
		if len(src) < 2 || src[0] != "KV_presence_status" {
			_ = msg.Term() // not a revision of presence_status
			return
		}
		rev, err := strconv.ParseUint(src[1], 10, 64)
		if err != nil {
			_ = msg.Term()
			return
		}
		status, devices, lastSeen := "offline", 0, int64(0)
		switch msg.Headers().Get("KV-Operation") {
		case "DEL", "PURGE": // the record was removed by hand: offline
		default:
			var rec struct {
				Status   string `json:"status"`    // what the user's own devices see
				Public   string `json:"public"`    // what everybody else sees
				Devices  int    `json:"devices"`   // live connections
				LastSeen int64  `json:"last_seen"` // unix seconds
			}
			if err := json.Unmarshal(msg.Data(), &rec); err != nil {
				_ = msg.Term() // not a greendot record
				return
			}
			status, devices, lastSeen = rec.Status, rec.Devices, rec.LastSeen
		}
		if err := store(user, status, devices, lastSeen, rev); err != nil {
			_ = msg.NakWithDelay(time.Second) // handed out again, still in order
			return
		}
		_ = msg.Ack()
	})
	if err != nil {
		return err
	}
	defer cc.Stop()
	<-done
	return nil
}

// natsConsumerAdd is the consumer that nats consumer add creates from the
// words after it, for the flags the feed sample uses, as the nats CLI
// reads them: --pull (no push subject), --filter, --deliver subject (the
// newest revision of each subject, then every new one), --ack,
// --max-pending (acks pending), --max-deliver, --wait (the ack wait),
// --replay and --defaults (nothing asked).
func natsConsumerAdd(words []string) (stream string, cfg jetstream.ConsumerConfig, err error) {
	var pos []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "--") {
			pos = append(pos, w)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(w, "--"), "=")
		takes := name != "pull" && name != "defaults"
		if takes && !hasVal {
			if i++; i >= len(words) {
				return "", cfg, fmt.Errorf("%s needs a value", w)
			}
			val = words[i]
		}
		switch name {
		case "pull", "defaults":
		case "filter":
			cfg.FilterSubject = strings.Trim(val, "'")
		case "deliver":
			if val != "subject" {
				return "", cfg, fmt.Errorf("--deliver %s is not the sample's", val)
			}
			cfg.DeliverPolicy = jetstream.DeliverLastPerSubjectPolicy
		case "ack":
			if val != "explicit" {
				return "", cfg, fmt.Errorf("--ack %s is not the sample's", val)
			}
			cfg.AckPolicy = jetstream.AckExplicitPolicy
		case "max-pending":
			cfg.MaxAckPending, err = strconv.Atoi(val)
		case "max-deliver":
			cfg.MaxDeliver, err = strconv.Atoi(val)
		case "wait":
			cfg.AckWait, err = time.ParseDuration(val)
		case "replay":
			if val != "instant" {
				return "", cfg, fmt.Errorf("--replay %s is not the sample's", val)
			}
			cfg.ReplayPolicy = jetstream.ReplayInstantPolicy
		default:
			return "", cfg, fmt.Errorf("%s is a flag this test does not know", w)
		}
		if err != nil {
			return "", cfg, fmt.Errorf("%s %s: %v", w, val, err)
		}
	}
	if len(pos) != 2 {
		return "", cfg, fmt.Errorf("want a stream and a consumer, got %q", pos)
	}
	cfg.Durable = pos[1]
	return pos[0], cfg, nil
}

// TestFeedSamples runs the feed samples of docs/integration.md: the Go
// consumer stores alice's transitions as she connects and turns busy, in
// order, with growing revisions; and the nats consumer add command, read
// as the nats CLI reads it, makes the same consumer.
func TestFeedSamples(t *testing.T) {
	doctest.Verbatim(t, doctest.Sample(t, "docs/integration.md", `cons, err := js.CreateOrUpdateConsumer(ctx, "presence_feed"`), "feed_test.go")
	sys := systest.Start(t, systest.Options{})
	ctx := context.Background()
	js := sys.Store.JetStream()
	if _, err := presence.EnsureFeed(ctx, js, presence.BucketOptions{}, 0); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []stored
	)
	store := func(user, status string, devices int, lastSeen int64, rev uint64) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, stored{user, status, devices, lastSeen, rev})
		return nil
	}
	done := make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- follow(ctx, js, store, done) }()
	defer func() {
		close(done)
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}()
	alice := sys.Dial(sys.Gateway(), "alice")
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	if err := alice.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, systest.EventTimeout, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if n := len(seen); n == 0 || seen[n-1] != (stored{"alice", "busy", 1, seen[n-1].lastSeen, seen[n-1].rev}) {
			return fmt.Errorf("stored %+v, want alice busy on one device last", seen)
		}
		return nil
	})
	mu.Lock()
	for i, s := range seen {
		if s.user != "alice" || i > 0 && s.rev <= seen[i-1].rev {
			t.Errorf("stored %+v: want alice's revisions, growing", seen)
		}
	}
	if seen[0].status != "online" {
		t.Errorf("stored %+v first, want alice online", seen[0])
	}
	mu.Unlock()

	cmd := doctest.Sample(t, "docs/integration.md", "nats consumer add presence_feed app-backend")
	words := strings.Fields(strings.ReplaceAll(cmd.Text, "\\\n", " "))
	if len(words) < 3 || words[0] != "nats" || words[1] != "consumer" || words[2] != "add" {
		t.Fatalf("%s is not nats consumer add", cmd)
	}
	stream, cli, err := natsConsumerAdd(words[3:])
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	cons, err := js.Consumer(ctx, stream, cli.Durable)
	if err != nil {
		t.Fatalf("%s names %s %s, which the Go sample did not make: %v", cmd, stream, cli.Durable, err)
	}
	got := cons.CachedInfo().Config
	if got.FilterSubject != cli.FilterSubject || got.DeliverPolicy != cli.DeliverPolicy || got.AckPolicy != cli.AckPolicy ||
		got.MaxAckPending != cli.MaxAckPending || got.MaxDeliver != cli.MaxDeliver || got.AckWait != cli.AckWait || got.ReplayPolicy != cli.ReplayPolicy {
		t.Errorf("%s makes %+v; the Go sample made %+v", cmd, cli, got)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, cli); err != nil {
		t.Errorf("%s on the Go sample's consumer: %v", cmd, err)
	}
}
