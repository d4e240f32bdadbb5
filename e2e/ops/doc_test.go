package ops

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/presence"
)

const docPath = "../../docs/operations.md"

// block is a fenced code block of the page.
type block struct {
	lang    string
	lines   []string
	line    int // of the opening fence
	heading string
}

// readDoc returns the page's text and its code blocks.
func readDoc(t *testing.T) (string, []block) {
	t.Helper()
	data, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	var (
		blocks  []block
		cur     *block
		heading string
	)
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &block{lang: strings.TrimPrefix(line, "```"), line: n, heading: heading}
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, line)
		case strings.HasPrefix(line, "#"):
			heading = strings.TrimSpace(strings.TrimLeft(line, "#"))
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: code block never closed", docPath, cur.line)
	}
	return string(data), blocks
}

// splitShell splits a command line into pipeline stages of words, reading
// quotes as a POSIX shell does (no variables, no globbing). A # that
// starts a word starts a comment.
func splitShell(line string) ([][]string, error) {
	var (
		stages [][]string
		words  []string
		word   strings.Builder
		inWord bool
	)
	end := func() {
		if inWord {
			words = append(words, word.String())
			word.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated single quote")
			}
			word.WriteString(line[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == '"':
			j := i + 1
			for ; j < len(line) && line[j] != '"'; j++ {
				if line[j] == '\\' && j+1 < len(line) {
					j++
				}
				word.WriteByte(line[j])
			}
			if j >= len(line) {
				return nil, errors.New("unterminated double quote")
			}
			inWord = true
			i = j
		case c == ' ' || c == '\t':
			end()
		case c == '|':
			end()
			stages = append(stages, words)
			words = nil
		case c == '#' && !inWord:
			i = len(line)
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	end()
	if len(words) > 0 || len(stages) > 0 {
		stages = append(stages, words)
	}
	for _, s := range stages {
		if len(s) == 0 {
			return nil, errors.New("empty pipeline stage")
		}
	}
	return stages, nil
}

func TestSplitShell(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{`nats kv get presence_status alice --raw`, `[[nats kv get presence_status alice --raw]]`},
		{`nats kv ls presence_graph 'follows.*.alice'`, `[[nats kv ls presence_graph follows.*.alice]]`},
		{`nats req x '{"a": 1}'`, `[[nats req x {"a": 1}]]`},
		{`nats req x ''`, `[[nats req x ]]`},
		{`curl -s http://h/metrics | grep '^a b'`, `[[curl -s http://h/metrics] [grep ^a b]]`},
		{`nats sub "presence.event.*" # every event`, `[[nats sub presence.event.*]]`},
	}
	for _, tt := range tests {
		got, err := splitShell(tt.in)
		if err != nil || fmt.Sprint(got) != tt.want {
			t.Errorf("splitShell(%q) = %v, %v, want %s", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{`a 'b`, `a "b`, `a | | b`} {
		if _, err := splitShell(bad); err == nil {
			t.Errorf("splitShell(%q) succeeded", bad)
		}
	}
}

// output is what a command printed: its text, and the JSON documents in
// it.
type output struct {
	text   string
	values []any
}

func (o *output) addJSON(data []byte) {
	var v any
	if json.Unmarshal(data, &v) == nil {
		o.values = append(o.values, v)
	}
	o.text += string(data) + "\n"
}

// runner performs the page's commands against a scene, through nats.go and
// net/http, checking every name on the way.
type runner struct {
	sc    *scene
	ctx   context.Context
	js    jetstream.JetStream
	dirty bool // alice was kicked: connect her again before the next command
}

// placeholders the page may use, and what they stand for in the scene.
func (r *runner) expand(line string) (string, error) {
	for ph, fn := range map[string]func() string{
		"<conn_id>":     func() string { return r.sc.aliceWeb.Hello.ConnID },
		"<gateway_id>":  r.sc.gw1.ID,
		"<lease>":       r.sc.lease,
		"<cid>":         r.sc.cid,
		"<instance_id>": r.sc.instance,
	} {
		if strings.Contains(line, ph) {
			line = strings.ReplaceAll(line, ph, fn())
		}
	}
	if m := regexp.MustCompile(`<[a-z_]+>`).FindString(line); m != "" {
		return "", fmt.Errorf("unknown placeholder %s", m)
	}
	return line, nil
}

// exec runs one command line, a pipeline whose first stage is nats or
// curl and whose other stages are grep.
func (r *runner) exec(line string) (output, error) {
	if r.dirty {
		r.sc.connectAlice()
		r.dirty = false
	}
	line, err := r.expand(line)
	if err != nil {
		return output{}, err
	}
	stages, err := splitShell(line)
	if err != nil || len(stages) == 0 {
		return output{}, fmt.Errorf("parse: %v", err)
	}
	var out output
	switch cmd := stages[0]; cmd[0] {
	case "nats":
		out, err = r.nats(cmd[1:])
	case "curl":
		out, err = r.curl(cmd[1:])
	default:
		return output{}, fmt.Errorf("%s: only nats and curl commands are run", cmd[0])
	}
	if err != nil {
		return out, err
	}
	for _, st := range stages[1:] {
		if st[0] != "grep" || len(st) != 2 {
			return out, fmt.Errorf("pipeline stage %v: only grep PATTERN is supported", st)
		}
		re, err := regexp.Compile(st[1])
		if err != nil {
			return out, fmt.Errorf("grep %q: %v", st[1], err)
		}
		var kept []string
		for l := range strings.SplitSeq(out.text, "\n") {
			if re.MatchString(l) {
				kept = append(kept, l)
			}
		}
		if len(kept) == 0 {
			return out, fmt.Errorf("grep %q matched nothing in:\n%s", st[1], head(out.text))
		}
		out = output{text: strings.Join(kept, "\n")}
	}
	return out, nil
}

func head(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "..."
	}
	return s
}

// args splits words into flags (--name=value, -x) and positionals; flags
// must be among allowed (a flag name mapped to whether it takes a value).
func args(words []string, allowed map[string]bool) (map[string]string, []string, error) {
	flags := map[string]string{}
	var pos []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") || w == "-" {
			pos = append(pos, w)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(w, "-"), "=")
		takes, ok := allowed[name]
		if !ok {
			return nil, nil, fmt.Errorf("flag %s is not one this test knows", w)
		}
		if takes && !hasVal {
			if i+1 >= len(words) {
				return nil, nil, fmt.Errorf("flag %s needs a value", w)
			}
			i++
			val = words[i]
		}
		flags[name] = val
	}
	return flags, pos, nil
}

func (r *runner) nats(words []string) (output, error) {
	if len(words) == 0 {
		return output{}, errors.New("nats with no command")
	}
	switch words[0] {
	case "kv":
		return r.kv(words[1:])
	case "req", "request":
		return r.req(words[1:])
	case "sub", "subscribe":
		return r.sub(words[1:])
	case "micro", "service":
		return r.micro(words[1:])
	case "consumer":
		return r.consumer(words[1:])
	case "stream":
		return r.stream(words[1:])
	}
	return output{}, fmt.Errorf("nats %s is not run by this test", words[0])
}

var buckets = []string{presence.LeasesBucket, presence.ConnsBucket, presence.StatusBucket, presence.GraphBucket, presence.RoomsBucket, presence.TimersBucket}

// checkKey checks a key (or, with filter, a key filter) of a bucket has
// the shape greendot gives it.
func checkKey(bucket, key string, filter bool) error {
	bad := fmt.Errorf("%q is not a %s key%s greendot writes", key, bucket, map[bool]string{true: " filter", false: ""}[filter])
	switch bucket {
	case presence.StatusBucket:
		if !presence.ValidUserID(key) {
			return bad
		}
	case presence.LeasesBucket:
		if filter {
			return bad
		}
		if _, _, ok := presence.ParseLeaseKey(key); !ok {
			return bad
		}
	case presence.ConnsBucket:
		if filter {
			parts := strings.Split(key, ".")
			switch {
			case len(parts) == 4 && key == presence.UserConnsFilter(parts[2]) && presence.ValidUserID(parts[2]):
			case len(parts) == 3 && key == presence.LeaseConnsFilter(parts[0], parts[1]) && parts[0] != "*" && parts[1] != "*":
			default:
				return bad
			}
			return nil
		}
		if _, _, _, _, ok := presence.ParseLeaseConnKey(key); !ok {
			return bad
		}
	case presence.RoomsBucket:
		if filter {
			if key == presence.RoomKeysFilter(sceneRoom) {
				return nil
			}
			return bad
		}
		if _, ok := presence.ParseRoomKey(key); !ok {
			return bad
		}
	case presence.TimersBucket:
		user, ok := strings.CutPrefix(key, presence.CustomTimerKey(""))
		if filter || !ok || !presence.ValidUserID(user) {
			return bad
		}
	case presence.GraphBucket:
		if filter {
			for _, u := range []string{"alice", "bob"} {
				if key == presence.FollowersFilter(u) || key == presence.FollowingFilter(u) {
					return nil
				}
			}
			return bad
		}
		if _, _, ok := presence.ParseFollowKey(key); ok {
			return nil
		}
		if _, ok := presence.ParseSettingsKey(key); !ok {
			return bad
		}
	default:
		return fmt.Errorf("bucket %q is not greendot's (%v)", bucket, buckets)
	}
	return nil
}

func (r *runner) kv(words []string) (output, error) {
	if len(words) == 0 {
		return output{}, errors.New("nats kv with no command")
	}
	flags, pos, err := args(words[1:], map[string]bool{"raw": false})
	if err != nil {
		return output{}, err
	}
	var out output
	if words[0] == "ls" && len(pos) == 0 {
		names := r.js.KeyValueStoreNames(r.ctx)
		var got []string
		for n := range names.Name() {
			got = append(got, n)
		}
		for _, b := range buckets {
			if !slices.Contains(got, b) {
				return out, fmt.Errorf("bucket %s not listed: %v", b, got)
			}
		}
		out.text = strings.Join(got, "\n")
		return out, nil
	}
	if len(pos) == 0 {
		return out, fmt.Errorf("nats kv %s: no bucket", words[0])
	}
	bucket := pos[0]
	if !slices.Contains(buckets, bucket) {
		return out, fmt.Errorf("bucket %q is not greendot's (%v)", bucket, buckets)
	}
	kv, err := r.js.KeyValue(r.ctx, bucket)
	if err != nil {
		return out, err
	}
	switch words[0] {
	case "ls":
		if bucket == presence.RoomsBucket {
			r.sc.joinRoom() // a room with a member to list
		}
		var lister jetstream.KeyLister
		if len(pos) > 1 {
			if err := checkKey(bucket, pos[1], true); err != nil {
				return out, err
			}
			lister, err = kv.ListKeysFiltered(r.ctx, pos[1])
		} else {
			lister, err = kv.ListKeys(r.ctx)
		}
		if err != nil {
			return out, err
		}
		var keys []string
		for k := range lister.Keys() {
			keys = append(keys, k)
		}
		if len(keys) == 0 {
			return out, errors.New("no keys listed")
		}
		out.text = strings.Join(keys, "\n")
	case "get":
		if len(pos) != 2 {
			return out, errors.New("nats kv get BUCKET KEY")
		}
		if err := checkKey(bucket, pos[1], false); err != nil {
			return out, err
		}
		e, err := kv.Get(r.ctx, pos[1])
		if err != nil {
			return out, fmt.Errorf("get %s %s: %w", bucket, pos[1], err)
		}
		if _, raw := flags["raw"]; !raw {
			out.text = fmt.Sprintf("%s > %s revision: %d\n", bucket, e.Key(), e.Revision())
		}
		out.addJSON(e.Value())
	case "history":
		if len(pos) != 2 {
			return out, errors.New("nats kv history BUCKET KEY")
		}
		if err := checkKey(bucket, pos[1], false); err != nil {
			return out, err
		}
		hist, err := kv.History(r.ctx, pos[1])
		if err != nil {
			return out, err
		}
		if len(hist) < 2 {
			return out, fmt.Errorf("history of %s has %d revisions, want the transitions", pos[1], len(hist))
		}
		for _, e := range hist {
			out.addJSON(e.Value())
		}
	case "watch":
		return r.watch(kv, bucket, pos[1:])
	default:
		return out, fmt.Errorf("nats kv %s is not run by this test", words[0])
	}
	return out, nil
}

// watch reads a watcher's initial values, makes changes, and requires to
// see at least one of them.
func (r *runner) watch(kv jetstream.KeyValue, bucket string, keys []string) (output, error) {
	var out output
	var (
		w   jetstream.KeyWatcher
		err error
	)
	switch len(keys) {
	case 0:
		w, err = kv.WatchAll(r.ctx)
	case 1:
		if err := checkKey(bucket, keys[0], false); err != nil {
			return out, err
		}
		w, err = kv.Watch(r.ctx, keys[0])
	default:
		return out, errors.New("nats kv watch BUCKET [KEY]")
	}
	if err != nil {
		return out, err
	}
	defer func() { _ = w.Stop() }()
	timeout := time.After(10 * time.Second)
	for caughtUp := false; ; {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return out, errors.New("watcher stopped")
			}
			if e == nil {
				caughtUp = true
				r.sc.stimulate()
				continue
			}
			out.addJSON(e.Value())
			if caughtUp {
				return out, nil
			}
		case <-timeout:
			return out, errors.New("no change seen within 10s")
		}
	}
}

func (r *runner) sub(words []string) (output, error) {
	_, pos, err := args(words, map[string]bool{"count": true})
	if err != nil {
		return output{}, err
	}
	if len(pos) != 1 {
		return output{}, errors.New("nats sub SUBJECT")
	}
	subject := pos[0]
	rooms := subject == presence.RoomWildcard || subject == presence.RoomSubject(sceneRoom)
	if subject != presence.EventWildcard && !isEventSubject(subject) && !rooms {
		return output{}, fmt.Errorf("subject %q is neither %s nor presence.EventSubject(user), nor a room subject", subject, presence.EventWildcard)
	}
	sub, err := r.sc.nc.SubscribeSync(subject)
	if err != nil {
		return output{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.sc.nc.Flush(); err != nil {
		return output{}, err
	}
	if rooms {
		r.sc.joinRoom()
	} else {
		r.sc.stimulate()
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		return output{}, fmt.Errorf("nothing on %s: %w", subject, err)
	}
	var out output
	out.addJSON(m.Data)
	return out, nil
}

func (r *runner) req(words []string) (output, error) {
	flags, pos, err := args(words, map[string]bool{"replies": true, "timeout": true, "raw": false})
	if err != nil {
		return output{}, err
	}
	if len(pos) < 1 || len(pos) > 2 {
		return output{}, errors.New("nats req SUBJECT [BODY]")
	}
	subject, body := pos[0], ""
	if len(pos) == 2 {
		body = pos[1]
	}
	if !slices.Contains(adminclient.Subjects(), subject) {
		return output{}, fmt.Errorf("subject %q is not an admin subject (%v)", subject, adminclient.Subjects())
	}
	timeout := 5 * time.Second
	if v, ok := flags["timeout"]; ok {
		if timeout, err = time.ParseDuration(v); err != nil {
			return output{}, err
		}
	}
	opts := adminclient.GatherOptions{Want: 1, Timeout: timeout}
	if v, ok := flags["replies"]; ok {
		if opts.Want, err = strconv.Atoi(v); err != nil {
			return output{}, err
		}
	}
	msgs, err := adminclient.Gather(r.ctx, r.sc.nc, subject, []byte(body), opts)
	if err != nil {
		return output{}, err
	}
	var out output
	for _, m := range msgs {
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			return out, fmt.Errorf("error reply %s: %s", code, m.Header.Get(micro.ErrorHeader))
		}
		out.addJSON(m.Data)
	}
	if len(out.values) != len(msgs) {
		return out, fmt.Errorf("replies are not JSON: %s", out.text)
	}
	if subject == admin.GatewayKickSubject {
		r.dirty = true
	}
	return out, nil
}

func (r *runner) micro(words []string) (output, error) {
	if len(words) == 0 {
		return output{}, errors.New("nats micro with no command")
	}
	_, pos, err := args(words[1:], map[string]bool{"json": false})
	if err != nil {
		return output{}, err
	}
	// How many instances answer: the scene runs two gateways, a reaper,
	// a fanout and a webhooks process.
	instances := map[string]int{admin.GatewayService: 2, admin.ReaperService: 1, admin.FanoutService: 1, admin.WebhooksService: 1}
	var subject string
	want := 5
	switch words[0] {
	case "ls", "list", "ping":
		subject = "$SRV.PING"
		if len(pos) > 0 {
			return output{}, errors.New("nats micro ls takes no service here")
		}
	case "info", "stats":
		if len(pos) < 1 || len(pos) > 2 {
			return output{}, fmt.Errorf("nats micro %s SERVICE [ID]", words[0])
		}
		if !slices.Contains(adminclient.Services(), pos[0]) {
			return output{}, fmt.Errorf("service %q is not greendot's (%v)", pos[0], adminclient.Services())
		}
		subject = adminclient.InfoSubject(pos[0])
		if words[0] == "stats" {
			subject = adminclient.StatsSubject(pos[0])
		}
		want = instances[pos[0]]
		if len(pos) == 2 {
			subject += "." + pos[1]
			want = 1
		}
	default:
		return output{}, fmt.Errorf("nats micro %s is not run by this test", words[0])
	}
	msgs, err := adminclient.Gather(r.ctx, r.sc.nc, subject, nil, adminclient.GatherOptions{Want: want, Timeout: 5 * time.Second})
	if err != nil {
		return output{}, err
	}
	var out output
	names := map[string]int{}
	for _, m := range msgs {
		var id micro.ServiceIdentity
		if err := json.Unmarshal(m.Data, &id); err != nil {
			return out, err
		}
		names[id.Name]++
		out.addJSON(m.Data)
	}
	switch {
	case subject == "$SRV.PING":
		for _, s := range adminclient.Services() {
			if names[s] == 0 {
				return out, fmt.Errorf("service %s not listed: %v", s, names)
			}
		}
	case len(msgs) == 0 || names[pos[0]] != len(msgs):
		return out, fmt.Errorf("%s: replies from %v", subject, names)
	}
	return out, nil
}

func (r *runner) consumer(words []string) (output, error) {
	if len(words) != 3 || words[0] != "info" {
		return output{}, errors.New("nats consumer info STREAM CONSUMER")
	}
	stream, name := words[1], words[2]
	ok := stream == presence.StreamName(presence.LeasesBucket) && name == presence.ReaperConsumer ||
		stream == presence.StreamName(presence.ConnsBucket) && name == presence.ReaperConsumer ||
		stream == presence.StreamName(presence.StatusBucket) && name == presence.FanoutConsumer ||
		stream == presence.FeedStream && name == presence.WebhooksConsumer
	if !ok {
		return output{}, fmt.Errorf("%s %s is not a greendot stream and consumer", stream, name)
	}
	c, err := r.js.Consumer(r.ctx, stream, name)
	if err != nil {
		return output{}, err
	}
	info, err := c.Info(r.ctx)
	if err != nil {
		return output{}, err
	}
	data, _ := json.Marshal(info)
	var out output
	out.addJSON(data)
	return out, nil
}

// stream runs nats stream info presence_feed: the one stream of greendot
// that is not a bucket's.
func (r *runner) stream(words []string) (output, error) {
	if len(words) != 2 || words[0] != "info" || words[1] != presence.FeedStream {
		return output{}, fmt.Errorf("nats stream info %s", presence.FeedStream)
	}
	st, err := r.js.Stream(r.ctx, words[1])
	if err != nil {
		return output{}, err
	}
	info, err := st.Info(r.ctx)
	if err != nil {
		return output{}, err
	}
	if len(info.Sources) != 1 || info.Sources[0].Name != presence.StreamName(presence.StatusBucket) {
		return output{}, fmt.Errorf("%s sources %+v, want %s", words[1], info.Sources, presence.StreamName(presence.StatusBucket))
	}
	data, _ := json.Marshal(info)
	var out output
	out.addJSON(data)
	return out, nil
}

// httpPaths are the paths the page may fetch, by the address it uses.
var httpPaths = map[string][]string{
	"127.0.0.1:8080": {"/healthz", "/readyz", "/metrics", "/api/presence/users/"},
	"127.0.0.1:8222": {"/subsz", "/connz"},
	"127.0.0.1:9101": {"/healthz", "/readyz", "/metrics"},
	"127.0.0.1:9102": {"/healthz", "/readyz", "/metrics"},
}

func (r *runner) curl(words []string) (output, error) {
	_, pos, err := args(words, map[string]bool{"s": false})
	if err != nil {
		return output{}, err
	}
	if len(pos) != 1 {
		return output{}, errors.New("curl [-s] URL")
	}
	u, err := url.Parse(pos[0])
	if err != nil {
		return output{}, err
	}
	paths, ok := httpPaths[u.Host]
	real := r.sc.hosts[u.Host]
	if !ok || real == "" {
		return output{}, fmt.Errorf("address %s is not one the page sets up (%v)", u.Host, r.sc.hosts)
	}
	if !slices.ContainsFunc(paths, func(p string) bool {
		return u.Path == p || strings.HasSuffix(p, "/") && strings.HasPrefix(u.Path, p)
	}) {
		return output{}, fmt.Errorf("path %s is not served on %s (%v)", u.Path, u.Host, paths)
	}
	if rest, ok := strings.CutPrefix(u.Path, "/api/presence/users/"); ok && !presence.ValidUserID(rest) {
		return output{}, fmt.Errorf("%s: not a user id", u.Path)
	}
	u.Host = real
	req, err := http.NewRequestWithContext(r.ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return output{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return output{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return output{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return output{}, fmt.Errorf("GET %s: %s: %s", pos[0], resp.Status, head(string(body)))
	}
	var out output
	out.addJSON(body)
	out.text = string(body)
	return out, nil
}

// shape reports whether actual has every field of sample, recursively,
// with the same JSON kinds: the page's samples may leave fields out, never
// show ones that do not exist.
func shape(path string, sample, actual any) error {
	switch s := sample.(type) {
	case map[string]any:
		a, ok := actual.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: the page shows an object, the reply has %T", path, actual)
		}
		for k, v := range s {
			// A map keyed by ids: compare the values' shapes, not the keys.
			if looksLikeID(k) {
				if len(a) == 0 {
					return fmt.Errorf("%s: the page shows entries, the reply has none", path)
				}
				for _, each := range a {
					if err := shape(path+".<id>", v, each); err != nil {
						return err
					}
				}
				continue
			}
			av, ok := a[k]
			if !ok {
				return fmt.Errorf("%s.%s: the page shows it, the reply has no such field (it has %v)", path, k, keys(a))
			}
			if err := shape(path+"."+k, v, av); err != nil {
				return err
			}
		}
		return nil
	case []any:
		a, ok := actual.([]any)
		if !ok {
			return fmt.Errorf("%s: the page shows an array, the reply has %T", path, actual)
		}
		if len(s) > 0 && len(a) == 0 {
			return fmt.Errorf("%s: the page shows elements, the reply has none", path)
		}
		for i, e := range s {
			var firstErr error
			matched := false
			for _, ae := range a {
				err := shape(fmt.Sprintf("%s[%d]", path, i), e, ae)
				if err == nil {
					matched = true
					break
				}
				if firstErr == nil {
					firstErr = err
				}
			}
			if !matched {
				return firstErr
			}
		}
		return nil
	default:
		if fmt.Sprintf("%T", sample) != fmt.Sprintf("%T", actual) {
			return fmt.Errorf("%s: the page shows a %T (%v), the reply a %T (%v)", path, sample, sample, actual, actual)
		}
		return nil
	}
}

// looksLikeID reports whether a JSON object key is an id (a nuid) rather
// than a field name.
func looksLikeID(k string) bool {
	return len(k) >= 20 && strings.ToLower(k) != k
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestOperationsPageCommands runs every command of the page's sh blocks
// against a running system, and checks each JSON sample against the reply
// of the command just before it.
func TestOperationsPageCommands(t *testing.T) {
	_, blocks := readDoc(t)
	sc := startScene(t)
	ctx := context.Background()
	js, err := jetstream.New(sc.nc)
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{sc: sc, ctx: ctx, js: js}
	ran, samples := 0, 0
	var last output
	lastAt := ""
	for i, b := range blocks {
		where := fmt.Sprintf("%s:%d (%s)", filepath.Base(docPath), b.line, b.heading)
		switch b.lang {
		case "sh":
			for j, line := range b.lines {
				if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
					continue
				}
				out, err := r.exec(line)
				if err != nil {
					t.Errorf("%s line %d: %s\n  %v", where, b.line+1+j, line, err)
					out = output{}
				}
				last, lastAt = out, line
				ran++
			}
		case "json":
			if i == 0 || blocks[i-1].lang != "sh" {
				t.Errorf("%s: a JSON sample must follow the sh block of the command it shows", where)
				continue
			}
			var sample any
			if err := json.Unmarshal([]byte(strings.Join(b.lines, "\n")), &sample); err != nil {
				t.Errorf("%s: sample is not JSON: %v", where, err)
				continue
			}
			samples++
			if len(last.values) == 0 {
				t.Errorf("%s: %q printed no JSON to compare the sample with", where, lastAt)
				continue
			}
			var errs []error
			for _, v := range last.values {
				err := shape("$", sample, v)
				if err == nil {
					errs = nil
					break
				}
				errs = append(errs, err)
			}
			if errs != nil {
				t.Errorf("%s: the sample does not match what %q answers: %v\nreply: %s", where, lastAt, errs[0], head(last.text))
			}
		default:
			t.Errorf("%s: code block of language %q: use sh for commands and json for their output", where, b.lang)
		}
	}
	if ran < 30 || samples < 8 {
		t.Errorf("ran %d commands and checked %d samples: the page lost its recipes?", ran, samples)
	}
}
