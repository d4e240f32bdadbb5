package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/adminclient"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// readyz returns the status and the decoded body of the standalone's GET
// /readyz at addr, or an error when it did not answer.
func readyz(addr string) (int, map[string]string, error) {
	code, body := getQuiet("http://" + addr + "/readyz")
	if code == 0 {
		return 0, nil, errors.New(body)
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		return code, nil, fmt.Errorf("body %q: %w", body, err)
	}
	return code, m, nil
}

// connectOperator connects to the standalone's NATS server at url, as
// the nats CLI does, until the test ends.
func connectOperator(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("operator"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// info returns the one Info a standalone's service answers on subject.
func info(t *testing.T, nc *nats.Conn, subject string) admin.Info {
	t.Helper()
	infos, err := adminclient.GatherJSON[admin.Info](context.Background(), nc, subject, nil,
		adminclient.GatherOptions{Want: 1, Timeout: 5 * time.Second})
	if err != nil || len(infos) != 1 {
		t.Fatalf("%s: %+v, %v; want one info", subject, infos, err)
	}
	return infos[0]
}

// TestStandaloneReadyz makes each part of standalone mode that consumes
// a stream not ready in turn, as an operator's `nats consumer rm` does
// while the stream takes no more consumers: GET /readyz answers 503 and
// names that part with its own reason, the part's own info says it is
// not ready while the gateway's says it is; once the consumer can be
// created again, /readyz answers 200.
func TestStandaloneReadyz(t *testing.T) {
	secret := "standalone's signing secret"
	sink := systest.NewHookSink(t, []byte(secret))
	t.Setenv("GREENDOT_WEBHOOK_SECRET", secret)
	p := start(t, "standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
		"--webhook-url", sink.URL)
	m := p.awaitOutput(t, devReadyRE)
	addr, natsURL := m[1], m[2]
	// The ready line says every part is ready.
	if code, body, err := readyz(addr); code != http.StatusOK || !maps.Equal(body, map[string]string{"status": "ready"}) {
		t.Fatalf("GET /readyz after the ready line = %d %v %v, want 200 ready", code, body, err)
	}
	nc := connectOperator(t, natsURL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	for _, part := range []struct{ name, stream, consumer, info string }{
		{"reaper", presence.StreamName(presence.LeasesBucket), presence.ReaperConsumer, admin.ReaperInfoSubject},
		{"fanout", presence.StreamName(presence.StatusBucket), presence.FanoutConsumer, admin.FanoutInfoSubject},
		{"webhooks", presence.FeedStream, presence.WebhooksConsumer, admin.WebhooksInfoSubject},
	} {
		// Another consumer takes the only place left on the stream, and
		// the part's own goes.
		if _, err := js.CreateOrUpdateConsumer(ctx, part.stream, jetstream.ConsumerConfig{Durable: "other"}); err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, part.stream)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		limited := cfg
		limited.MaxConsumers = 1
		if _, err := js.UpdateStream(ctx, limited); err != nil {
			t.Fatal(err)
		}
		if err := js.DeleteConsumer(ctx, part.stream, part.consumer); err != nil {
			t.Fatal(err)
		}
		missing := "consumer " + part.consumer + " on " + part.stream
		natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			code, body, err := readyz(addr)
			if err != nil {
				return err
			}
			if code != http.StatusServiceUnavailable || len(body) != 3 || body["status"] != "unavailable" ||
				body["part"] != part.name || !strings.HasPrefix(body["error"], part.name+": not ready") ||
				!strings.Contains(body["error"], missing) {
				return fmt.Errorf("GET /readyz = %d %v, want 503 naming the %s and its missing %s", code, body, part.name, missing)
			}
			return nil
		})
		if in := info(t, nc, part.info); in.Ready || !strings.Contains(in.NotReady, missing) {
			t.Errorf("%s info: ready %v, not_ready %q; want not ready, naming %s", part.name, in.Ready, in.NotReady, missing)
		}
		if in := info(t, nc, admin.GatewayInfoSubject); !in.Ready {
			t.Errorf("gateway info: not ready (%s) while the %s is not", in.NotReady, part.name)
		}

		// The stream takes consumers again: the part creates its own.
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		if err := js.DeleteConsumer(ctx, part.stream, "other"); err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
			if code, body, err := readyz(addr); code != http.StatusOK || !maps.Equal(body, map[string]string{"status": "ready"}) {
				return fmt.Errorf("GET /readyz = %d %v %v, want 200 ready", code, body, err)
			}
			return nil
		})
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, p.stderr)
	}
}

// TestStandaloneStopsBeingReadyFirst stops standalone mode while its
// gateway drains a socket: GET /readyz no longer answers 200 while the
// reaper, fanout and webhooks process, which stop after the gateway, still
// run and say they are ready.
func TestStandaloneStopsBeingReadyFirst(t *testing.T) {
	secret := "standalone's signing secret"
	sink := systest.NewHookSink(t, []byte(secret))
	t.Setenv("GREENDOT_WEBHOOK_SECRET", secret)
	p := start(t, "standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
		"--webhook-url", sink.URL, "--drain-period", "8s")
	m := p.awaitOutput(t, devReadyRE)
	addr, natsURL := m[1], m[2]
	nc := connectOperator(t, natsURL)
	// Of two sockets drained over 8s, the second is closed 4s after
	// the first.
	for _, user := range []string{"alice", "bob"} {
		c := dial(t, "ws://"+addr+"/ws?user="+user, client.Options{})
		defer systest.KeepAlive(c, 300*time.Millisecond)()
	}
	if code, body, err := readyz(addr); code != http.StatusOK {
		t.Fatalf("GET /readyz = %d %v %v, want 200", code, body, err)
	}

	p.cancel() // as SIGINT does
	natstest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if code, body, _ := readyz(addr); code == http.StatusOK {
			return fmt.Errorf("GET /readyz = %d %v while stopping", code, body)
		}
		return nil
	})
	for _, subject := range []string{admin.ReaperInfoSubject, admin.FanoutInfoSubject, admin.WebhooksInfoSubject} {
		if in := info(t, nc, subject); !in.Ready {
			t.Errorf("%s: not ready (%s) as soon as /readyz is not: it stopped before the gateway", subject, in.NotReady)
		}
	}
	if code := p.wait(t, 40*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, p.stderr)
	}
	if code, body, err := readyz(addr); err == nil {
		t.Errorf("GET /readyz after the exit = %d %v, want no answer", code, body)
	}
}

// TestStandaloneWaitsForItsParts starts standalone mode on a store whose
// status records the reaper's sweep at start cannot read for a while (their
// stream takes no more consumers, so the sweep's listing fails, and the
// reaper tries again): the start outlasts many log intervals, each line
// naming the reaper as GET /readyz does, with its sweep and why it failed,
// without failing, and prints the ready line once the sweep can go
// through. The wait has no deadline; a
// sweep of a large store takes long the same way.
func TestStandaloneWaitsForItsParts(t *testing.T) {
	defer func(d time.Duration) { waitLogEvery = d }(waitLogEvery)
	waitLogEvery = 100 * time.Millisecond
	args := []string{"standalone", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"}
	ctx := context.Background()
	stream := presence.StreamName(presence.StatusBucket)

	// A first run creates the buckets, and the fanout's durable consumer
	// on the status records' stream; the stream then takes no more
	// consumers than its durable ones.
	p := start(t, args...)
	js, err := jetstream.New(connectOperator(t, p.awaitOutput(t, devReadyRE)[2]))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	durables := 0
	for c := range st.ListConsumers(ctx).Info() {
		if c.Config.Durable != "" {
			durables++
		}
	}
	if durables == 0 {
		t.Fatalf("no durable consumer on %s", stream)
	}
	cfg := st.CachedInfo().Config
	limited := cfg
	limited.MaxConsumers = durables
	if _, err := js.UpdateStream(ctx, limited); err != nil {
		t.Fatal(err)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, p.stderr)
	}

	p = start(t, args...)
	// Each says what the reaper waits for: its sweep, which failed.
	waiting := regexp.MustCompile(`msg="waiting for a part to be ready" waited=\S+ part=reaper err="reaper: not ready: start-up sweep [^"]*maximum consumers limit reached"`)
	natstest.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if n := len(waiting.FindAllString(p.stderr.String(), -1)); n < 5 {
			return fmt.Errorf("%d lines say the start waits for the reaper, want 5; stderr:\n%s", n, p.stderr)
		}
		return nil
	})
	if devReadyRE.MatchString(p.stdout.String()) {
		t.Fatalf("ready line printed while the reaper is not ready:\n%s", p.stdout)
	}
	if !strings.Contains(p.stderr.String(), `msg="start-up sweep" svc=reaper err="list presence_status [>]: nats: maximum consumers limit reached"`) {
		t.Errorf("the reaper did not log why its sweep failed; stderr:\n%s", p.stderr)
	}

	// The stream takes consumers again: the sweep goes through.
	m := regexp.MustCompile(`msg="nats server ready" .* url=(\S+)`).FindStringSubmatch(p.stderr.String())
	if m == nil {
		t.Fatalf("no NATS URL in the log:\n%s", p.stderr)
	}
	js, err = jetstream.New(connectOperator(t, m[1]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	addr := p.awaitOutput(t, devReadyRE)[1]
	if code, body, err := readyz(addr); code != http.StatusOK {
		t.Errorf("GET /readyz after the ready line = %d %v %v, want 200", code, body, err)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, p.stderr)
	}
}
