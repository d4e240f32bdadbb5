package callout

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/signature"
)

func TestParseConnect(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	a, err := parseConnect([]byte(`{"user_id":"alice","expires_in":60,"session":"s1","watch":["bob","bob","carol"],"rooms":["doc:*"]}`), now)
	if err != nil {
		t.Fatal(err)
	}
	if a.Refused || a.UserID != "alice" || !a.Expires.Equal(now.Add(time.Minute)) || a.Session != "s1" ||
		!slices.Equal(a.Watch, []string{"bob", "carol"}) || !slices.Equal(a.Rooms, []string{"doc:*"}) {
		t.Errorf("answer = %+v", a)
	}
	if a, err := parseConnect([]byte(`{"user_id":"alice","expires_in":1}`), now); err != nil || a.Watch != nil || a.Rooms != nil || a.Session != "" {
		t.Errorf("bare answer = %+v, %v; want no claims, no session", a, err)
	}
	if a, err := parseConnect([]byte(` {"refuse":true} `), now); err != nil || !a.Refused {
		t.Errorf("refusal = %+v, %v", a, err)
	}
	for _, bad := range []string{
		``, `null`, `[]`, `{}`, `"alice"`,
		`{"refuse":false}`,
		`{"refuse":true,"user_id":"alice"}`,
		`{"user_id":"alice"}`,
		`{"expires_in":60}`,
		`{"user_id":"al.ice","expires_in":60}`,
		`{"user_id":"","expires_in":60}`,
		`{"user_id":"alice","expires_in":0}`,
		`{"user_id":"alice","expires_in":-5}`,
		`{"user_id":"alice","expires_in":1.5}`,
		`{"user_id":"alice","expires_in":"60"}`,
		`{"user_id":"alice","expires_in":2592001}`,
		`{"user_id":"alice","expires_in":60,"extra":1}`,
		`{"user_id":"alice","expires_in":60}{}`,
		`{"user_id":"alice","expires_in":60,"watch":"bob"}`,
		`{"user_id":"alice","expires_in":60,"watch":["no such id!"]}`,
		`{"user_id":"alice","expires_in":60,"rooms":["a*b"]}`,
		`{"user_id":"alice","expires_in":60,"session":` + jsonString(string(make([]byte, MaxSession+1))) + `}`,
	} {
		if a, err := parseConnect([]byte(bad), now); err == nil {
			t.Errorf("parse %q = %+v, want an error", bad, a)
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestConnectHTTPIsSigned: the question is POSTed as JSON, signed with
// the secret as the app policy's are.
func TestConnectHTTPIsSigned(t *testing.T) {
	var got ConnectQuestion
	var sigErr error
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sigErr = signature.Verify(secret, r.Header.Get(signature.Header), body, time.Now(), time.Minute)
		_ = json.Unmarshal(body, &got)
		_, _ = w.Write([]byte(`{"user_id":"alice","expires_in":60}`))
	}))
	defer srv.Close()
	c := NewHTTP(HTTPConfig{URL: srv.URL, Secret: secret, Timeout: 10 * time.Second})
	a, err := c.Connect(context.Background(), &ConnectQuestion{Type: TypeConnect, Headers: map[string]string{"Cookie": "sessionid=abc"}})
	if err != nil || a.UserID != "alice" {
		t.Fatalf("Connect = %+v, %v", a, err)
	}
	if sigErr != nil {
		t.Errorf("signature: %v", sigErr)
	}
	if got.Type != TypeConnect || got.Headers["Cookie"] != "sessionid=abc" {
		t.Errorf("question = %+v", got)
	}
}

// TestConnectQuestionJSON: each question has all its fields, and only
// those.
func TestConnectQuestionJSON(t *testing.T) {
	for _, tc := range []struct {
		q    ConnectQuestion
		want string
	}{
		{ConnectQuestion{Type: TypeConnect}, `{"type":"connect","headers":{}}`},
		{ConnectQuestion{Type: TypeConnect, Headers: map[string]string{"Cookie": "a=b"}}, `{"type":"connect","headers":{"Cookie":"a=b"}}`},
		{ConnectQuestion{Type: TypeRefresh, UserID: "alice"}, `{"type":"refresh","user_id":"alice","session":""}`},
		{ConnectQuestion{Type: TypeRefresh, UserID: "alice", Session: "s"}, `{"type":"refresh","user_id":"alice","session":"s"}`},
	} {
		got, err := json.Marshal(&tc.q)
		if err != nil || string(got) != tc.want {
			t.Errorf("%+v = %s, %v; want %s", tc.q, got, err, tc.want)
		}
	}
}
