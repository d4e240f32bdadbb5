package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/greendot/greendot/internal/adminclient"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/admin"
	"github.com/greendot/greendot/pkg/version"
)

func TestParseUserRequest(t *testing.T) {
	tests := []struct {
		name, in string
		want     string
		bad      bool
	}{
		{name: "bare", in: "alice", want: "alice"},
		{name: "bare with newline", in: "alice\n", want: "alice"},
		{name: "json", in: `{"user_id":"alice"}`, want: "alice"},
		{name: "json string", in: `"alice"`, want: "alice"},
		{name: "empty", in: "", bad: true},
		{name: "blank", in: "  ", bad: true},
		{name: "bad id", in: "al ice", bad: true},
		{name: "wildcard", in: "alice.*", bad: true},
		{name: "json bad id", in: `{"user_id":"a.b"}`, bad: true},
		{name: "json unknown field", in: `{"user":"alice"}`, bad: true},
		{name: "json trailing", in: `{"user_id":"alice"} x`, bad: true},
		{name: "json broken", in: `{"user_id":`, bad: true},
		{name: "too long", in: strings.Repeat("a", 65), bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := admin.ParseUserRequest([]byte(tt.in))
			if tt.bad {
				if !errors.Is(err, admin.ErrBadRequest) {
					t.Fatalf("got %+v, %v, want ErrBadRequest", got, err)
				}
				return
			}
			if err != nil || got.UserID != tt.want {
				t.Fatalf("got %+v, %v, want %q", got, err, tt.want)
			}
		})
	}
}

func TestParseKickRequest(t *testing.T) {
	tests := []struct {
		name, in string
		want     admin.KickRequest
		bad      bool
	}{
		{name: "bare", in: "alice", want: admin.KickRequest{UserID: "alice", Code: 1008, Reason: admin.DefaultKickReason}},
		{name: "normal close", in: `{"user_id":"alice","code":1000,"reason":"bye"}`,
			want: admin.KickRequest{UserID: "alice", Code: 1000, Reason: "bye"}},
		{name: "one connection", in: `{"user_id":"alice","conn_id":"abc"}`,
			want: admin.KickRequest{UserID: "alice", ConnID: "abc", Code: 1008, Reason: admin.DefaultKickReason}},
		{name: "other code", in: `{"user_id":"alice","code":1001}`, bad: true},
		{name: "reason too long", in: `{"user_id":"alice","reason":"` + strings.Repeat("x", 124) + `"}`, bad: true},
		{name: "bad conn id", in: `{"user_id":"alice","conn_id":"a.b"}`, bad: true},
		{name: "no user", in: `{"code":1000}`, bad: true},
		{name: "empty", in: ``, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := admin.ParseKickRequest([]byte(tt.in))
			if tt.bad {
				if !errors.Is(err, admin.ErrBadRequest) {
					t.Fatalf("got %+v, %v, want ErrBadRequest", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v, want %+v", got, err, tt.want)
			}
		})
	}
}

// echo is a test service: a broadcast endpoint that answers its instance,
// a queue endpoint that answers the request's user, and one that fails
// as the request says.
func startEcho(t *testing.T, nc *nats.Conn, id string, hold chan struct{}) *admin.Server {
	return startEchoWith(t, nc, id, hold, nil, nil)
}

func startEchoWith(t *testing.T, nc *nats.Conn, id string, hold, entered chan struct{}, finished *atomic.Bool) *admin.Server {
	t.Helper()
	srv, err := admin.Start(nc, admin.ServiceConfig{
		Name:        "greendot-test",
		Description: "test service",
		InfoSubject: "greendot.test.info",
		ID:          id,
		Config:      map[string]any{"ttl": "1s", "workers": 3},
		Load:        func() map[string]any { return map[string]any{"conns": 7} },
		Ready:       func(context.Context) error { return nil },
		Endpoints: []admin.Endpoint{
			{Name: "all", Subject: "greendot.test.all", Broadcast: true, Handle: func(ctx context.Context, _ []byte) (any, error) {
				return map[string]string{"id": id, "instance": admin.InstanceOf(ctx)}, nil
			}},
			{Name: "one", Subject: "greendot.test.one", Handle: func(_ context.Context, data []byte) (any, error) {
				r, err := admin.ParseUserRequest(data)
				if err != nil {
					return nil, err
				}
				return r, nil
			}},
			{Name: "fail", Subject: "greendot.test.fail", Handle: func(_ context.Context, data []byte) (any, error) {
				switch string(data) {
				case "unavailable":
					return nil, admin.ErrUnavailable
				case "hold":
					if entered != nil {
						close(entered)
					}
					<-hold
					if finished != nil {
						finished.Store(true)
					}
					return "held", nil
				}
				return nil, errors.New("boom")
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

func TestServiceEndpoints(t *testing.T) {
	s := natstest.RunServer(t)
	ctx := context.Background()
	hold := make(chan struct{})
	a := startEcho(t, natstest.Connect(t, s), "a", hold)
	defer a.Stop()
	b := startEcho(t, natstest.Connect(t, s), "b", hold)
	defer b.Stop()
	nc := natstest.Connect(t, s)

	inst, err := adminclient.Instances(ctx, nc, "greendot-test", 500*time.Millisecond)
	if err != nil || len(inst) != 2 {
		t.Fatalf("instances = %+v, %v, want 2", inst, err)
	}

	// Broadcast: both instances answer.
	all, err := adminclient.Broadcast[map[string]string](ctx, nc, "greendot-test", "greendot.test.all", struct{}{}, 3*time.Second)
	if err != nil || len(all) != 2 {
		t.Fatalf("broadcast = %v, %v, want 2 replies", all, err)
	}
	ids := map[string]string{}
	for _, r := range all {
		ids[r["id"]] = r["instance"]
	}
	if ids["a"] != a.Instance() || ids["b"] != b.Instance() {
		t.Fatalf("replies %v, want instances a=%s b=%s", ids, a.Instance(), b.Instance())
	}

	// Queue: exactly one answers.
	msgs, err := adminclient.Gather(ctx, nc, "greendot.test.one", []byte("alice"), adminclient.GatherOptions{Timeout: 300 * time.Millisecond})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("queue endpoint: %d replies, %v, want 1", len(msgs), err)
	}
	var r admin.UserRequest
	if err := adminclient.Request(ctx, nc, "greendot.test.one", admin.UserRequest{UserID: "bob"}, &r); err != nil || r.UserID != "bob" {
		t.Fatalf("request = %+v, %v", r, err)
	}

	// Errors are micro errors with codes and a JSON body.
	err = adminclient.Request(ctx, nc, "greendot.test.one", "no spaces allowed", &r)
	var se *adminclient.ServiceError
	if !errors.As(err, &se) || se.Code != admin.CodeBadRequest || !errors.Is(err, admin.ErrBadRequest) || se.Subject != "greendot.test.one" {
		t.Fatalf("bad request: %v, want a 400 ServiceError", err)
	}
	for _, tt := range []struct{ body, code, name string }{
		{"unavailable", admin.CodeUnavailable, "unavailable"},
		{"other", admin.CodeInternal, "internal"},
	} {
		m, err := nc.Request("greendot.test.fail", []byte(tt.body), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get(micro.ErrorCodeHeader); got != tt.code {
			t.Errorf("%s: code %q, want %q", tt.body, got, tt.code)
		}
		var body admin.ErrorBody
		if err := json.Unmarshal(m.Data, &body); err != nil || body.Error != tt.name || body.Message == "" {
			t.Errorf("%s: body %s (%v), want error %q", tt.body, m.Data, err, tt.name)
		}
	}

	// Info: config, load and readiness, from every instance.
	infos, err := adminclient.GatherJSON[admin.Info](ctx, nc, "greendot.test.info", nil, adminclient.GatherOptions{Want: 2, Timeout: 2 * time.Second})
	if err != nil || len(infos) != 2 {
		t.Fatalf("infos = %+v, %v", infos, err)
	}
	for _, in := range infos {
		if in.Service != "greendot-test" || !in.Ready || in.Version != version.String() ||
			in.Config["ttl"] != "1s" || in.Load["conns"] != float64(7) {
			t.Errorf("info = %+v", in)
		}
	}

	// micro's own discovery shows the configuration as metadata and the
	// load as the info endpoint's stats.
	m, err := nc.Request(adminclient.InfoSubject("greendot-test")+"."+a.Instance(), nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var mi micro.Info
	if err := json.Unmarshal(m.Data, &mi); err != nil || mi.Metadata["ttl"] != "1s" || mi.Metadata["id"] != "a" || len(mi.Endpoints) != 4 {
		t.Fatalf("micro info = %+v, %v", mi, err)
	}
	m, err = nc.Request(adminclient.StatsSubject("greendot-test")+"."+a.Instance(), nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var ms micro.Stats
	if err := json.Unmarshal(m.Data, &ms); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range ms.Endpoints {
		if e.Name == admin.InfoEndpoint {
			found = strings.Contains(string(e.Data), `"conns":7`)
		}
	}
	if !found {
		t.Fatalf("stats of info endpoint lack the load: %+v", ms.Endpoints)
	}
}

func TestStopWaitsForRequests(t *testing.T) {
	s := natstest.RunServer(t)
	hold, entered := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	srv := startEchoWith(t, natstest.Connect(t, s), "a", hold, entered, &finished)
	nc := natstest.Connect(t, s)

	replied := make(chan error, 1)
	go func() {
		m, err := nc.Request("greendot.test.fail", []byte("hold"), 5*time.Second)
		if err == nil && string(m.Data) != `"held"` {
			err = errors.New("reply " + string(m.Data))
		}
		replied <- err
	}()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached its handler")
	}
	stopped := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() { stopped <- srv.Stop() })
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v while a request was being handled", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(hold)
	wg.Wait()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if !finished.Load() {
		t.Fatal("Stop returned before the request's handler finished")
	}
	if err := <-replied; err != nil {
		t.Fatalf("held request: %v", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	// A stopped service is gone from discovery.
	inst, err := adminclient.Instances(context.Background(), nc, "greendot-test", 300*time.Millisecond)
	if err != nil || len(inst) != 0 {
		t.Fatalf("instances after Stop = %v, %v, want none", inst, err)
	}
}

func TestGatherNoResponders(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	start := time.Now()
	_, err := adminclient.Gather(context.Background(), nc, "greendot.nobody.here", nil, adminclient.GatherOptions{Timeout: 5 * time.Second})
	if !errors.Is(err, adminclient.ErrNoReply) {
		t.Fatalf("err = %v, want ErrNoReply", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("no responders took %v: it should be known at once", time.Since(start))
	}
	inst, err := adminclient.Instances(context.Background(), nc, "greendot-nothing", 300*time.Millisecond)
	if err != nil || len(inst) != 0 {
		t.Fatalf("instances = %v, %v, want none", inst, err)
	}
	_, err = adminclient.Kick(context.Background(), nc, admin.KickRequest{UserID: "alice"}, 600*time.Millisecond)
	if !errors.Is(err, adminclient.ErrNoReply) {
		t.Fatalf("kick with no gateway: %v, want ErrNoReply", err)
	}
}

// startService starts a test service on its own connection to s with the
// given endpoints and readiness check, stopped when the test ends.
func startService(t *testing.T, s *server.Server, ready func(context.Context) error, endpoints ...admin.Endpoint) *admin.Server {
	t.Helper()
	srv, err := admin.Start(natstest.Connect(t, s), admin.ServiceConfig{
		Name:        "greendot-test",
		InfoSubject: "greendot.test.info",
		Ready:       ready,
		Endpoints:   endpoints,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

func TestReplyTooLarge(t *testing.T) {
	s := natstest.RunServerWithOptions(t, &server.Options{MaxPayload: 4096})
	startService(t, s, nil, admin.Endpoint{Name: "big", Subject: "greendot.test.big", Handle: func(context.Context, []byte) (any, error) {
		return strings.Repeat("x", 5000), nil
	}})
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The requester learns why, rather than waiting in vain.
	var v string
	err := adminclient.Request(ctx, nc, "greendot.test.big", nil, &v)
	var se *adminclient.ServiceError
	if !errors.As(err, &se) || se.Code != admin.CodeInternal || !strings.Contains(se.Description, "4096") {
		t.Fatalf("reply too large: %v, want a 500 ServiceError naming the limit", err)
	}
}

func TestInfoWhileReadinessHangs(t *testing.T) {
	s := natstest.RunServer(t)
	// A readiness check that waits for JetStream, which does not answer.
	startService(t, s, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	nc := natstest.Connect(t, s)
	// The info still comes in the time an operator waits for it (the docs
	// ask with --timeout=2s; here with room for a loaded machine), saying
	// that the process is not ready.
	infos, err := adminclient.GatherJSON[admin.Info](context.Background(), nc, "greendot.test.info", nil, adminclient.GatherOptions{Want: 1, Timeout: 5 * time.Second})
	if err != nil || len(infos) != 1 || infos[0].Ready || !strings.Contains(infos[0].NotReady, admin.ReadyTimeout.String()) {
		t.Fatalf("info = %+v, %v, want one reply saying not ready within %v", infos, err, admin.ReadyTimeout)
	}
}

func TestStopCutsRequestsUnavailable(t *testing.T) {
	s := natstest.RunServer(t)
	entered := make(chan struct{})
	srv := startService(t, s, nil, admin.Endpoint{Name: "wait", Subject: "greendot.test.wait", Handle: func(ctx context.Context, _ []byte) (any, error) {
		close(entered)
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	nc := natstest.Connect(t, s)
	replied := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var v any
		replied <- adminclient.Request(ctx, nc, "greendot.test.wait", nil, &v)
	}()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached its handler")
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	// The process is stopping: what it was doing is unavailable, not an
	// internal error.
	if err := <-replied; !errors.Is(err, admin.ErrUnavailable) {
		t.Fatalf("request cut off by Stop: %v, want a 503", err)
	}
}
