package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	page := `# HELP go_memstats_heap_inuse_bytes Number of heap bytes that are in use.
# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 4.194304e+06
greendot_gateway_kv_writes_total{kind="status"} 1234
greendot_gateway_kv_writes_total{kind="a b"} 5 1700000000000
process_resident_memory_bytes 2.5e+07
`
	m, err := parseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		"go_memstats_heap_inuse_bytes":                    4194304,
		`greendot_gateway_kv_writes_total{kind="status"}`: 1234,
		`greendot_gateway_kv_writes_total{kind="a b"}`:    5,
		"process_resident_memory_bytes":                   25e6,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (%v), want %v", series, got, ok, want)
		}
	}
	if _, err := parseMetrics(strings.NewReader("x notanumber\n")); err == nil {
		t.Error("a bad value was accepted")
	}
}

func TestReadProc(t *testing.T) {
	ps, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if ps.rss < 1<<20 || ps.cpu < 0 {
		t.Errorf("this process: RSS %d bytes, CPU %v", ps.rss, ps.cpu)
	}
	if _, err := readProc(-1); err == nil {
		t.Error("no error for a process that does not exist")
	}
}

func TestHistMerge(t *testing.T) {
	a, b := newHist(), newHist()
	for i := 1; i <= 100; i++ {
		a.record(time.Duration(i) * time.Millisecond)
	}
	b.record(time.Second)
	b.record(-time.Millisecond)
	if b.negative != 1 {
		t.Errorf("negative = %d, want 1", b.negative)
	}
	m := newMerged()
	for _, h := range []*hist{a, b} {
		enc, err := h.encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.add(enc); err != nil {
			t.Fatal(err)
		}
	}
	if m.Count() != 102 {
		t.Errorf("count %d, want 102", m.Count())
	}
	if p50 := m.ms(50); p50 < 49 || p50 > 51 {
		t.Errorf("p50 = %v ms, want about 50", p50)
	}
	if mx := m.maxMS(); mx < 999 || mx > 1001 {
		t.Errorf("max = %v ms, want about 1000", mx)
	}
	if err := m.add([]byte("not a histogram")); err == nil {
		t.Error("a bad encoding was merged")
	}
}

func TestReportSummaryAndMarkdown(t *testing.T) {
	rep := &Report{Scenario: ScenarioIdle, Config: Config{Conns: 10, Gateways: 1, Workers: 1, Sources: 1}}
	for _, v := range []float64{3, 1, 2, 10} {
		rep.Runs = append(rep.Runs, RunResult{Figures: []Figure{{Name: "x", Value: v, Unit: "bytes", Target: "<= 2048"}}})
	}
	rep.summarize()
	s, ok := rep.Figure("x")
	if !ok || s.Median != 2.5 || s.Min != 1 || s.Max != 10 || s.Runs != 4 || s.Target != "<= 2048" {
		t.Errorf("summary %+v", s)
	}
	var b bytes.Buffer
	if err := rep.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| x | 2.50 | 1 | 10 | bytes | <= 2048 |") {
		t.Errorf("markdown:\n%s", b.String())
	}
}

func TestParseGatewayURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:8080":           "ws://127.0.0.1:8080/ws http://127.0.0.1:8080",
		"ws://127.0.0.1:8080/ws":   "ws://127.0.0.1:8080/ws http://127.0.0.1:8080",
		"http://127.0.0.1:8080":    "ws://127.0.0.1:8080/ws http://127.0.0.1:8080",
		"wss://gw.example.com/ws":  "wss://gw.example.com/ws https://gw.example.com",
		"https://gw.example.com:1": "wss://gw.example.com:1/ws https://gw.example.com:1",
	} {
		g, err := parseGatewayURL(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got := g.ws + " " + g.http; got != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
	for _, in := range []string{"ftp://x:1", "ws://", "::"} {
		if _, err := parseGatewayURL(in); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", in, err)
		}
	}
}

// TestWorkerBadCommands drives a worker with commands out of order and
// malformed ones: each is answered with an error, and the worker goes on.
func TestWorkerBadCommands(t *testing.T) {
	inR, inW := io.Pipe()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- RunWorker(context.Background(), inR, &out) }()
	enc := json.NewEncoder(inW)
	l := Layout{Run: "r_", Idle: 2, Workers: 1, Gateways: 1}
	for _, c := range []Command{
		{Op: OpConnect},
		{Op: OpSetup},
		{Op: OpSetup, Setup: &Setup{Layout: l, URLs: []string{"ws://127.0.0.1:1/ws", "ws://127.0.0.1:2/ws"}, ConnectConcurrency: 1, DialTimeout: time.Second}},
		{Op: OpSetup, Setup: &Setup{Layout: l, URLs: []string{"http://127.0.0.1:1/ws"}, ConnectConcurrency: 1, DialTimeout: time.Second}},
		{Op: OpSetup, Setup: &Setup{Worker: 1, Layout: l, URLs: []string{"ws://127.0.0.1:1/ws"}, ConnectConcurrency: 1, DialTimeout: time.Second}},
		{Op: OpSetup, Setup: &Setup{Layout: l, URLs: []string{"ws://127.0.0.1:1/ws"}, ConnectConcurrency: 1, DialTimeout: time.Second}},
		{Op: OpSetup, Setup: &Setup{Layout: l, URLs: []string{"ws://127.0.0.1:1/ws"}, ConnectConcurrency: 1, DialTimeout: time.Second}},
		{Op: "dance"},
		{Op: OpStormWait},
		{Op: OpClose},
	} {
		if err := enc.Encode(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("RunWorker: %v", err)
	}
	_ = inW.Close()
	var got []string
	dec := json.NewDecoder(&out)
	for {
		var r Reply
		if err := dec.Decode(&r); err != nil {
			break
		}
		got = append(got, r.Op+":"+r.Err)
	}
	want := []string{
		"connect:the first command must be setup",
		"setup:setup without a setup",
		"setup:invalid bench configuration: 2 gateway URLs for 1 gateways",
		`setup:invalid bench configuration: gateway URL "http://127.0.0.1:1/ws": want ws://host:port/ws`,
		"setup:invalid bench configuration: worker 1 of 1",
		"setup:",
		"setup:setup was already given",
		`dance:unknown command "dance"`,
		"storm_wait:no storm in progress",
		"close:",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("replies:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A line that is not JSON ends the worker with an error.
	err := RunWorker(context.Background(), strings.NewReader("{not json\n"), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "read command") {
		t.Errorf("RunWorker on bad input: %v", err)
	}
}
