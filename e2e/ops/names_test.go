package ops

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/greendot/greendot/internal/adminclient"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// TestOperationsPageNames checks every name the page mentions, prose and
// tables included, against the code, and that the page documents every
// bucket, admin subject, micro service and metric there is.
func TestOperationsPageNames(t *testing.T) {
	text, _ := readDoc(t)
	find := func(pattern string) []string {
		var out []string
		for _, m := range regexp.MustCompile(pattern).FindAllString(text, -1) {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
		return out
	}

	for _, b := range find(`\bpresence_[a-z_]+`) {
		if b == protocol.TypePresenceBatch || b == protocol.TypePresenceInit {
			continue // frames of the client protocol
		}
		if !slices.Contains(buckets, b) && b != presence.FeedStream && b != presence.WebhookResyncBucket {
			t.Errorf("bucket %s: not one of %v, nor the webhooks' stream %s or bucket %s", b, buckets, presence.FeedStream, presence.WebhookResyncBucket)
		}
	}
	for _, b := range append(slices.Clone(buckets), presence.FeedStream, presence.WebhookResyncBucket) {
		if !strings.Contains(text, "`"+b+"`") {
			t.Errorf("bucket or stream %s is not documented", b)
		}
	}
	for _, s := range find(`\bKV_[a-z_]+`) {
		if s != presence.StreamName(presence.LeasesBucket) && s != presence.StreamName(presence.ConnsBucket) && s != presence.StreamName(presence.StatusBucket) &&
			s != presence.StreamName(presence.TimersBucket) {
			t.Errorf("stream %s: not the stream of a greendot bucket", s)
		}
	}
	for _, s := range find(`presence\.event\.[^\s` + "`" + `'"]+`) {
		if s != presence.EventWildcard && s != presence.EventSubject("<user>") && !isEventSubject(s) {
			t.Errorf("event subject %s: not presence.EventSubject or presence.EventWildcard", s)
		}
	}
	for _, s := range find(`presence\.gw\.[^\s` + "`" + `]+`) {
		if s != presence.SelfSubject("<gateway_id>") {
			t.Errorf("self subject %s: want %s", s, presence.SelfSubject("<gateway_id>"))
		}
	}
	for _, s := range find(`\bgreendot\.[a-z]+\.[a-z]+`) {
		if !slices.Contains(adminclient.Subjects(), s) {
			t.Errorf("admin subject %s: not one of %v", s, adminclient.Subjects())
		}
	}
	for _, s := range adminclient.Subjects() {
		if !strings.Contains(text, "`"+s+"`") {
			t.Errorf("admin subject %s is not documented", s)
		}
	}
	for _, s := range find(`\bgreendot-[a-z]+`) {
		if !slices.Contains(adminclient.Services(), s) {
			t.Errorf("micro service %s: not one of %v", s, adminclient.Services())
		}
	}
	for _, s := range adminclient.Services() {
		if !strings.Contains(text, "`"+s+"`") {
			t.Errorf("micro service %s is not documented", s)
		}
	}
	for _, c := range []string{presence.ReaperConsumer, presence.FanoutConsumer, presence.WebhooksConsumer} {
		if !strings.Contains(text, "consumer `"+c+"`") {
			t.Errorf("consumer %s is not documented", c)
		}
	}

	// Metrics: every name mentioned exists, and every metric greendot
	// registers has a row in the table.
	registered := metricNames(t)
	for _, m := range find(`\bgreendot_[a-z_]+`) {
		base := m
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if b, ok := strings.CutSuffix(m, suffix); ok && registered[b] {
				base = b
			}
		}
		if !registered[base] {
			t.Errorf("metric %s: no greendot process registers it", m)
		}
	}
	for _, m := range sortedKeys(registered) {
		if strings.HasPrefix(m, "greendot_") && !strings.Contains(text, "`"+m+"`") && !strings.Contains(text, "`"+m+"{") {
			t.Errorf("metric %s is registered but has no row in the page's metric table", m)
		}
	}

	// Flags: every --flag of the prose is a flag of greendot's command
	// line (in cmd/greendot's source, or --help and --version, which the
	// command line library adds) or of the nats CLI used here.
	src := cmdSource(t)
	natsFlags := []string{"replies", "timeout", "raw", "creds", "server"}
	libraryFlags := []string{"help", "version"}
	for _, f := range find(`--[a-z][a-z-]+`) {
		name := strings.TrimPrefix(f, "--")
		if slices.Contains(natsFlags, name) || slices.Contains(libraryFlags, name) {
			continue
		}
		if !strings.Contains(src, `"`+name+`"`) {
			t.Errorf("flag %s: greendot has no such flag (not in cmd/greendot)", f)
		}
	}
}

// isEventSubject reports whether s is presence.EventSubject of a valid
// user id.
func isEventSubject(s string) bool {
	u, ok := strings.CutPrefix(s, presence.EventSubject(""))
	return ok && presence.ValidUserID(u)
}

// cmdSource returns the source of cmd/greendot, where every flag name is
// written once, quoted.
func cmdSource(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob("../../cmd/greendot/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("cmd/greendot sources: %v", err)
	}
	var b strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(data)
	}
	return b.String()
}
