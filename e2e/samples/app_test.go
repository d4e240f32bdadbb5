package samples

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/doctest"
	"github.com/greendot/greendot/pkg/client"
	"github.com/greendot/greendot/pkg/protocol"
	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/system/systest"
)

// appSecret is what the gateways of these tests share with the app.
var appSecret = []byte("the secret greendot shares with the app, 32 bytes or more")

// subscribeBobAndCarol has alice, on c, subscribe to bob and carol, and
// returns whom the answer shows and the refusals that follow it.
func subscribeBobAndCarol(t *testing.T, c *client.Conn) (shown []string, denied map[string]string) {
	t.Helper()
	if err := c.Subscribe("s", "bob", "carol"); err != nil {
		t.Fatal(err)
	}
	init := systest.Await(t, c, systest.EventTimeout, "presence_init", func(m protocol.ServerMessage) bool {
		return m.Type == protocol.TypePresenceInit && m.ID == "s"
	})
	for _, p := range init.Users {
		shown = append(shown, p.UserID)
	}
	m := systest.Await(t, c, systest.EventTimeout, "denied", func(m protocol.ServerMessage) bool { return m.Type == protocol.TypeDenied })
	return shown, map[string]string{m.UserID: m.Reason}
}

// TestAppOverHTTPSamples runs the app policy's HTTP samples of
// docs/integration.md: the gateway POSTs the question the page shows, the
// app checks its signature with the page's Go lines and answers with the
// page's answer, and alice may watch bob, not carol.
func TestAppOverHTTPSamples(t *testing.T) {
	question := doctest.Sample(t, "docs/integration.md", `{"watcher": "alice", "targets": ["bob", "carol"]}`)
	answer := doctest.Sample(t, "docs/integration.md", `{"allow": ["bob"]}`)
	check := doctest.Sample(t, "docs/integration.md", "body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))")
	doctest.Verbatim(t, check, "app_test.go")

	secret := appSecret
	asked := make(chan []byte, 10)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err := signature.Verify(secret, r.Header.Get(signature.Header), body, time.Now(), 5*time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		asked <- body
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer.Text)
	}))
	defer app.Close()
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyApp, AppURL: app.URL, AppSecret: appSecret}})
	alice := sys.Dial(sys.Gateway(), "alice")
	shown, denied := subscribeBobAndCarol(t, alice)
	if !slices.Equal(shown, []string{"bob"}) || denied["carol"] != protocol.ReasonNotAllowed {
		t.Errorf("under %s, alice is shown %v and refused %v; want bob shown, carol not_allowed", answer, shown, denied)
	}

	var want, got map[string]any
	if err := json.Unmarshal([]byte(question.Text), &want); err != nil {
		t.Fatalf("%s: %v", question, err)
	}
	if err := json.Unmarshal(<-asked, &got); err != nil {
		t.Fatal(err)
	}
	targets := func(m map[string]any) []string {
		var out []string
		for _, v := range m["targets"].([]any) {
			out = append(out, v.(string))
		}
		slices.Sort(out)
		return out
	}
	if got["watcher"] != want["watcher"] || !slices.Equal(targets(got), targets(want)) {
		t.Errorf("the gateway asked %v; %s shows %v", got, question, want)
	}
	for k := range got {
		if _, ok := want[k]; !ok && k != "list" {
			t.Errorf("the gateway asked with the field %q, which %s does not show (%v)", k, question, slices.Sorted(maps.Keys(want)))
		}
	}
}

// TestAppOverNATSSample runs the micro service of docs/integration.md, as
// it is there, on the subject the page gives: alice may watch bob, the
// one her contacts lookup and mayWatch allow, and her friends list is
// her contacts.
func TestAppOverNATSSample(t *testing.T) {
	doctest.Verbatim(t, doctest.Sample(t, "docs/integration.md", "svc, err := micro.AddService(nc, micro.Config{"), "app_test.go")
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{Policy: gateway.PolicyApp, AppSubject: "greendot.authz.app.decide"}})
	nc := sys.NC
	contactsOf := func(user string) []string {
		if user == "alice" {
			return []string{"bob"}
		}
		return nil
	}
	mayWatch := func(watcher, target string) bool { return slices.Contains(contactsOf(watcher), target) }

	svc, err := micro.AddService(nc, micro.Config{
		Name:    "authz",
		Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{
			Subject: "greendot.authz.app.decide", // --authz-app-subject greendot.authz.app.decide
			Handler: micro.HandlerFunc(func(req micro.Request) {
				var q struct {
					Watcher string   `json:"watcher"`
					Targets []string `json:"targets"`
					List    bool     `json:"list"`
				}
				if err := json.Unmarshal(req.Data(), &q); err != nil {
					_ = req.Error("400", "bad question", nil)
					return
				}
				allow := []string{}
				if q.List {
					allow = contactsOf(q.Watcher) // the app's own lookup
				} else {
					for _, t := range q.Targets {
						if mayWatch(q.Watcher, t) {
							allow = append(allow, t)
						}
					}
				}
				_ = req.RespondJSON(map[string][]string{"allow": allow})
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()

	g := sys.Gateway()
	alice := sys.Dial(g, "alice")
	shown, denied := subscribeBobAndCarol(t, alice)
	if !slices.Equal(shown, []string{"bob"}) || denied["carol"] != protocol.ReasonNotAllowed {
		t.Errorf("alice is shown %v and refused %v; want bob shown, carol not_allowed", shown, denied)
	}
	resp, err := http.Get(g.HTTP + "/api/presence/friends?user=alice")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var friends struct {
		Friends []struct {
			UserID string `json:"user_id"`
		} `json:"friends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&friends); err != nil || resp.StatusCode != http.StatusOK ||
		len(friends.Friends) != 1 || friends.Friends[0].UserID != "bob" {
		t.Errorf("alice's friends: %d %+v %v; want bob", resp.StatusCode, friends, err)
	}
}
