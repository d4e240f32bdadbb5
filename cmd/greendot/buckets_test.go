package main

import (
	"strings"
	"testing"

	"github.com/greendot/greendot/internal/natstest"
)

func TestBucketsCommand(t *testing.T) {
	t.Parallel()
	url := natstest.RunServer(t).ClientURL()
	for range 2 { // idempotent
		code, stdout, stderr := runOnce(t, "buckets", "--nats-url", url)
		if code != 0 {
			t.Fatalf("buckets: exit %d; stderr:\n%s", code, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if len(lines) != 7 || !strings.HasPrefix(lines[0], "bucket ") {
			t.Fatalf("output:\n%s", stdout)
		}
		for i, name := range []string{"presence_conns", "presence_leases", "presence_status", "presence_graph", "presence_rooms", "presence_timers"} {
			if f := strings.Fields(lines[i+1]); len(f) != 6 || f[0] != name || f[1] != "1" || f[3] != "file" {
				t.Errorf("line %q, want bucket %s with 1 replica on file storage", lines[i+1], name)
			}
		}
	}
	if code, _, stderr := runOnce(t, "buckets", "--nats-url", url, "--replicas", "9"); code != 1 || !strings.Contains(stderr, "--replicas 9") {
		t.Errorf("--replicas 9: exit %d, stderr %q", code, stderr)
	}
	for _, bad := range [][]string{{"--feed-max-age", "1h"}, {"--feed", "--feed-max-age", "1s"}, {"--feed", "--feed-max-age", "-1h"}, {"--feed", "--feed-max-age", "0"}} {
		if code, _, stderr := runOnce(t, append([]string{"buckets", "--nats-url", url}, bad...)...); code != 1 || !strings.Contains(stderr, "--feed-max-age") {
			t.Errorf("%v: exit %d, stderr %q", bad, code, stderr)
		}
	}
	// With --feed, the stream presence_feed too, with its max age, and
	// the webhooks' bucket; then without --feed, they are still shown, as
	// they are.
	for _, args := range [][]string{{"--feed", "--feed-max-age", "1h"}, {"--feed", "--feed-max-age", "1h"}, nil} {
		code, stdout, stderr := runOnce(t, append([]string{"buckets", "--nats-url", url}, args...)...)
		if code != 0 {
			t.Fatalf("buckets %v: exit %d; stderr:\n%s", args, code, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if len(lines) != 11 || !strings.HasPrefix(lines[9], "stream ") {
			t.Fatalf("buckets %v output:\n%s", args, stdout)
		}
		if f := strings.Fields(lines[7]); len(f) != 6 || f[0] != "presence_webhook_resync" || f[1] != "1" || f[3] != "file" {
			t.Errorf("buckets %v: line %q, want presence_webhook_resync with 1 replica on file storage", args, lines[7])
		}
		if f := strings.Fields(lines[10]); len(f) != 7 || f[0] != "presence_feed" || f[1] != "1" || f[2] != "1h0m0s" || f[3] != "file" {
			t.Errorf("buckets %v: line %q, want presence_feed with 1 replica, kept 1h, on file storage", args, lines[10])
		}
	}
}
