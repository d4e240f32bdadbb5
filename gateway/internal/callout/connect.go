package callout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/presence"
)

// The connect proxy asks the app who a connecting client is, from the
// headers of its upgrade request, and later whether the session it
// answered is still on:
//
//	{"type":"connect","headers":{"Cookie":"sessionid=..."}}
//	{"type":"refresh","user_id":"alice","session":"..."}
//
// and the app answers either
//
//	{"user_id":"alice","expires_in":3600,"session":"...","watch":[...],"rooms":[...]}
//	{"refuse":true}
//
// session, watch and rooms being optional.

// The types of connect proxy questions.
const (
	TypeConnect = "connect"
	TypeRefresh = "refresh"
)

// MaxExpiresIn bounds an answer's expires_in, in seconds: 30 days.
const MaxExpiresIn = 30 * 24 * 3600

// MaxSession bounds an answer's session value, in bytes: it is kept for
// each connection the proxy let in.
const MaxSession = 1024

// ConnectQuestion is what the connect proxy asks.
type ConnectQuestion struct {
	Type string `json:"type"`
	// Headers are the upgrade request's forwarded headers (a connect
	// question), by canonical name, values of a repeated header joined.
	Headers map[string]string `json:"headers,omitempty"`
	// UserID and Session are those of the answer being refreshed (a
	// refresh question).
	UserID  string `json:"user_id,omitempty"`
	Session string `json:"session,omitempty"`
}

// MarshalJSON encodes a connect question with its headers (an empty
// object when none is forwarded), a refresh question with its user id and
// session (empty when the answer had none): each always has its fields.
func (q ConnectQuestion) MarshalJSON() ([]byte, error) {
	if q.Type == TypeConnect {
		h := q.Headers
		if h == nil {
			h = map[string]string{}
		}
		return json.Marshal(struct {
			Type    string            `json:"type"`
			Headers map[string]string `json:"headers"`
		}{q.Type, h})
	}
	return json.Marshal(struct {
		Type    string `json:"type"`
		UserID  string `json:"user_id"`
		Session string `json:"session"`
	}{q.Type, q.UserID, q.Session})
}

// ConnectAnswer is the app's answer, read.
type ConnectAnswer struct {
	// Refused is set when the app refused the client (or, for a refresh,
	// ended the session); nothing else is then.
	Refused bool
	UserID  string
	// Expires is when the answer ends: the time it was received plus its
	// expires_in.
	Expires time.Time
	// Lifetime is its expires_in.
	Lifetime time.Duration
	// Session is the opaque value the app wants back in refresh questions.
	Session string
	// Watch and Rooms are the claims as a token's are read
	// (auth.ParseWatchClaim, auth.ParseRoomsClaim): nil when absent.
	Watch, Rooms []string
}

// connectAnswer is an answer's JSON.
type connectAnswer struct {
	Refuse    bool            `json:"refuse"`
	UserID    *string         `json:"user_id"`
	ExpiresIn *int64          `json:"expires_in"`
	Session   *string         `json:"session"`
	Watch     json.RawMessage `json:"watch"`
	Rooms     json.RawMessage `json:"rooms"`
}

// parseConnect reads an answer strictly, received at now: one JSON object
// of the fields above and no other; a refusal with none of the others;
// otherwise a valid user id, expires_in from 1 to MaxExpiresIn whole
// seconds, a session of at most MaxSession bytes, and claims that a token
// could carry.
func parseConnect(data []byte, now time.Time) (ConnectAnswer, error) {
	const want = `want {"user_id": "<id>", "expires_in": <seconds>} or {"refuse": true}`
	var a connectAnswer
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return ConnectAnswer{}, fmt.Errorf("answer: %s: %v", want, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return ConnectAnswer{}, fmt.Errorf("answer: %s: more than one JSON value", want)
	}
	if a.Refuse {
		if a.UserID != nil || a.ExpiresIn != nil || a.Session != nil || a.Watch != nil || a.Rooms != nil {
			return ConnectAnswer{}, errors.New(`answer: a refusal has no other field than "refuse"`)
		}
		return ConnectAnswer{Refused: true}, nil
	}
	switch {
	case a.UserID == nil:
		return ConnectAnswer{}, fmt.Errorf(`answer has no "user_id": %s`, want)
	case !presence.ValidUserID(*a.UserID):
		return ConnectAnswer{}, fmt.Errorf("answer: user_id %q is not 1 to %d characters of A-Z a-z 0-9 _ -", *a.UserID, presence.MaxUserIDLen)
	case a.ExpiresIn == nil:
		return ConnectAnswer{}, fmt.Errorf(`answer has no "expires_in": %s`, want)
	case *a.ExpiresIn < 1 || *a.ExpiresIn > MaxExpiresIn:
		return ConnectAnswer{}, fmt.Errorf("answer: expires_in %d: want 1 to %d seconds", *a.ExpiresIn, MaxExpiresIn)
	case a.Session != nil && len(*a.Session) > MaxSession:
		return ConnectAnswer{}, fmt.Errorf("answer: session of %d bytes, over %d", len(*a.Session), MaxSession)
	}
	life := time.Duration(*a.ExpiresIn) * time.Second
	out := ConnectAnswer{UserID: *a.UserID, Expires: now.Add(life), Lifetime: life}
	if a.Session != nil {
		out.Session = *a.Session
	}
	var err error
	if out.Watch, err = auth.ParseWatchClaim(a.Watch); err != nil {
		return ConnectAnswer{}, fmt.Errorf("answer: %v", err)
	}
	if out.Rooms, err = auth.ParseRoomsClaim(a.Rooms); err != nil {
		return ConnectAnswer{}, fmt.Errorf("answer: %v", err)
	}
	return out, nil
}

// Connect asks the connect proxy question q. An error means no good
// answer came (the app down, slow, failing, or answering nonsense); a
// refusal is an answer.
func (c *Client) Connect(ctx context.Context, q *ConnectQuestion) (ConnectAnswer, error) {
	var out ConnectAnswer
	err := c.call(ctx, q, func(data []byte) (err error) {
		out, err = parseConnect(data, time.Now())
		return err
	})
	return out, err
}
