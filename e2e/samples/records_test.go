package samples

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/system/systest"
)

// keysOf returns the fields of a JSON object, and of the objects in its
// conns, as conns.<field>.
func keysOf(t *testing.T, what string, data []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	keys := slices.Collect(maps.Keys(m))
	if raw, ok := m["conns"]; ok {
		var conns map[string]map[string]json.RawMessage
		if err := json.Unmarshal(raw, &conns); err != nil {
			t.Fatalf("%s: conns: %v", what, err)
		}
		for _, c := range conns {
			for k := range c {
				if !slices.Contains(keys, "conns."+k) {
					keys = append(keys, "conns."+k)
				}
			}
		}
	}
	slices.Sort(keys)
	return keys
}

// storedRecord is a Record as the status bucket keeps it: with the count
// of the user's revisions not yet known to be in the feed.
type storedRecord struct {
	presence.Record
	Unfed int `json:"uf"`
}

// TestRecordSamples: the records docs/architecture.md shows are records
// of greendot's types (every field of a sample is one of the type's), and
// those of a live user, connected on the web from a laptop and busy,
// have no field the samples do not show.
func TestRecordSamples(t *testing.T) {
	sys := systest.Start(t, systest.Options{})
	alice, err := client.Dial(context.Background(), sys.Gateway().WS+"?user=alice&device=laptop&platform=web", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Abort()
	defer systest.KeepAlive(alice, systest.Heartbeat)()
	if err := alice.SetStatus("busy"); err != nil {
		t.Fatal(err)
	}
	systest.AwaitSelf(t, alice, presence.Busy, 1)
	ctx := context.Background()
	value := func(bucket, prefix string) []byte {
		t.Helper()
		kv, err := sys.Store.JetStream().KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range keys.Keys() {
			if strings.HasPrefix(k, prefix) {
				e, err := kv.Get(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				return e.Value()
			}
		}
		t.Fatalf("no key %s* in %s", prefix, bucket)
		return nil
	}
	for _, tt := range []struct {
		sample         doctest.Block
		bucket, prefix string
		into           any
	}{
		{doctest.Sample(t, "docs/architecture.md", `"started": `), presence.LeasesBucket, "", &presence.LeaseRecord{}},
		{doctest.Sample(t, "docs/architecture.md", "\"idle\": false}\n"), presence.ConnsBucket, sys.Gateway().ID() + ".", &presence.ConnRecord{}},
		{doctest.Sample(t, "docs/architecture.md", `{"chosen": "busy",`), presence.StatusBucket, "alice", &storedRecord{}},
	} {
		sample := tt.sample
		dec := json.NewDecoder(bytes.NewReader([]byte(sample.Text)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(tt.into); err != nil {
			t.Errorf("%s is not a %T: %v", sample, tt.into, err)
		}
		shown := keysOf(t, sample.String(), []byte(sample.Text))
		live := value(tt.bucket, tt.prefix)
		for _, k := range keysOf(t, tt.bucket, live) {
			if !slices.Contains(shown, k) {
				t.Errorf("%s: alice's record in %s has %q, which the sample does not show:\n%s", sample, tt.bucket, k, live)
			}
		}
	}
}
