package main

import (
	"strings"
	"testing"

	"github.com/greendot/greendot/internal/natstest"
)

func TestBucketsCommand(t *testing.T) {
	url := natstest.RunServer(t).ClientURL()
	for range 2 { // idempotent
		code, stdout, stderr := runOnce(t, "buckets", "--nats-url", url)
		if code != 0 {
			t.Fatalf("buckets: exit %d; stderr:\n%s", code, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[0], "bucket ") {
			t.Fatalf("output:\n%s", stdout)
		}
		for i, name := range []string{"presence_conns", "presence_status", "presence_graph"} {
			if f := strings.Fields(lines[i+1]); len(f) != 6 || f[0] != name || f[1] != "1" || f[3] != "file" {
				t.Errorf("line %q, want bucket %s with 1 replica on file storage", lines[i+1], name)
			}
		}
	}
	if code, _, stderr := runOnce(t, "buckets", "--nats-url", url, "--replicas", "9"); code != 1 || !strings.Contains(stderr, "--replicas 9") {
		t.Errorf("--replicas 9: exit %d, stderr %q", code, stderr)
	}
}
