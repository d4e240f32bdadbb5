package main

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

func TestGraphCommands(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	url := srv.ClientURL()
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// An existing bucket keeps its configuration: the commands bind to it
	// as it is.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: presence.GraphBucket, History: 5}); err != nil {
		t.Fatal(err)
	}

	graph := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := runOnce(t, append([]string{"graph", args[0], "--nats-url", url}, args[1:]...)...)
		if code != 0 {
			t.Fatalf("graph %v: exit %d; stderr:\n%s", args, code, stderr)
		}
		return stdout
	}
	expect := func(got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}

	expect(graph("follow", "alice", "bob"), "alice now follows bob\n")
	expect(graph("follow", "alice", "bob"), "alice already follows bob\n")
	expect(graph("follow", "bob", "alice"), "bob now follows alice; alice follows bob too, so they are mutual followers\n")
	expect(graph("follow", "alice", "carol"), "alice now follows carol\n")
	expect(graph("follow", "dave", "alice"), "dave now follows alice\n")
	expect(graph("privacy", "alice", "nobody"), "alice's last_seen is now hidden from everyone\n")

	store, err := presence.Bind(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []struct {
		a, b string
		want bool
	}{{"alice", "bob", true}, {"bob", "alice", true}, {"alice", "carol", true}, {"carol", "alice", false}, {"dave", "alice", true}} {
		if got, err := store.Follows(ctx, e.a, e.b); err != nil || got != e.want {
			t.Errorf("Follows(%s, %s) = %v, %v; want %v", e.a, e.b, got, err, e.want)
		}
	}
	kv, err := js.KeyValue(ctx, presence.GraphBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(ctx, presence.SettingsKey("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := presence.DecodeSettings(entry.Value()); err != nil || st.LastSeen != presence.Nobody {
		t.Errorf("settings.alice = %s (%v), want last_seen nobody", entry.Value(), err)
	}
	if _, err := kv.Get(ctx, presence.FollowKey("alice", "bob")); err != nil {
		t.Errorf("key %s: %v", presence.FollowKey("alice", "bob"), err)
	}

	var v graphView
	if err := json.Unmarshal([]byte(graph("show", "--json", "alice")), &v); err != nil {
		t.Fatal(err)
	}
	want := graphView{UserID: "alice", Following: []string{"bob", "carol"}, Followers: []string{"bob", "dave"}, Mutuals: []string{"bob"}, LastSeen: presence.Nobody}
	if !reflect.DeepEqual(v, want) {
		t.Errorf("show --json alice = %+v, want %+v", v, want)
	}
	text := graph("show", "carol")
	for _, line := range []string{"user:      carol", "following: (none)", "followers: alice (1)", "mutuals:   (none)", "last_seen: contacts (default)"} {
		if !strings.Contains(text, line) {
			t.Errorf("show carol lacks %q:\n%s", line, text)
		}
	}

	expect(graph("unfollow", "alice", "bob"), "alice no longer follows bob\n")
	expect(graph("unfollow", "alice", "bob"), "alice does not follow bob\n")
	if got, err := store.Follows(ctx, "alice", "bob"); err != nil || got {
		t.Errorf("after unfollow, Follows(alice, bob) = %v, %v", got, err)
	}
	if err := json.Unmarshal([]byte(graph("show", "--json", "alice")), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Mutuals) != 0 || !reflect.DeepEqual(v.Following, []string{"carol"}) {
		t.Errorf("after unfollow, show alice = %+v", v)
	}
	// A value written by hand that cannot be read is replaced.
	if _, err := kv.Put(ctx, presence.SettingsKey("alice"), []byte("Nobody")); err != nil {
		t.Fatal(err)
	}
	expect(graph("privacy", "alice", "everyone"), "alice's last_seen is now visible to everyone allowed to watch alice\n")

	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.History() != 5 {
		t.Errorf("graph bucket history %d after the commands, want the 5 it was created with", st.History())
	}
	// The other buckets were missing and have been created.
	for _, b := range []string{presence.ConnsBucket, presence.StatusBucket} {
		if _, err := js.KeyValue(ctx, b); err != nil {
			t.Errorf("bucket %s: %v", b, err)
		}
	}
}
