// Package adminclient calls the admin endpoints of greendot's processes
// (package admin) from Go: the scatter-gather that `nats req --replies=0`
// does, and typed calls for each endpoint. Tests and tools of this
// repository use it; operators use the nats CLI.
package adminclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/greendot/greendot/pkg/admin"
)

// DefaultGatherTimeout is how long Gather waits for replies unless told
// otherwise.
const DefaultGatherTimeout = 2 * time.Second

// maxReplies bounds the replies one Gather collects.
const maxReplies = 10_000

// GatherOptions says how long Gather collects replies.
type GatherOptions struct {
	// Want stops gathering once this many replies arrived; zero gathers
	// until Timeout.
	Want int
	// Timeout bounds the whole gathering; zero means DefaultGatherTimeout.
	Timeout time.Duration
	// Gap, when not zero, stops gathering once a reply has arrived and no
	// other followed for Gap (what `nats req --reply-timeout` does).
	Gap time.Duration
}

// DefaultGap is the pause after which Instances stops waiting for more
// instances to answer a ping: long enough for a busy process on another
// server of a cluster, short enough for a person waiting.
const DefaultGap = 500 * time.Millisecond

// Gather publishes data on subject and collects the replies of every
// responder (a scatter-gather, what `nats req --replies=0` does): until
// opts.Want replies arrived, opts.Timeout passed, or ctx ended. It returns
// ErrNoReply when nobody listens on subject, or when nobody answered and
// opts.Want is not zero.
func Gather(ctx context.Context, nc *nats.Conn, subject string, data []byte, opts GatherOptions) ([]*nats.Msg, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultGatherTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, data); err != nil {
		return nil, fmt.Errorf("publish %s: %w", subject, err)
	}
	var out []*nats.Msg
	for len(out) < maxReplies && (opts.Want <= 0 || len(out) < opts.Want) {
		wait, cancelGap := ctx, context.CancelFunc(func() {})
		if opts.Gap > 0 && len(out) > 0 {
			wait, cancelGap = context.WithTimeout(ctx, opts.Gap)
		}
		m, err := sub.NextMsgWithContext(wait)
		expired := wait.Err() != nil
		cancelGap()
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return nil, fmt.Errorf("%s: %w: no responders", subject, ErrNoReply)
		case err != nil && expired:
			// Gathered for the whole time, or the gap.
		case err != nil:
			return out, fmt.Errorf("gather %s: %w", subject, err)
		}
		if err != nil {
			break
		}
		out = append(out, m)
	}
	if len(out) == 0 && opts.Want > 0 {
		return nil, fmt.Errorf("%s: %w within %v", subject, ErrNoReply, timeout)
	}
	return out, nil
}

// Decode decodes an admin reply to a request sent on subject into v, or
// returns the *ServiceError it carries.
func Decode(subject string, m *nats.Msg, v any) error {
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		return &ServiceError{Code: code, Description: m.Header.Get(micro.ErrorHeader), Subject: subject}
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		return fmt.Errorf("decode reply: %w", err)
	}
	return nil
}

// Request sends req (JSON) to a queue endpoint and decodes its one reply
// into reply.
func Request(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	m, err := nc.RequestWithContext(ctx, subject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%s: %w: no responders", subject, ErrNoReply)
	}
	if err != nil {
		return fmt.Errorf("request %s: %w", subject, err)
	}
	return Decode(subject, m, reply)
}

// GatherJSON sends req (JSON) to a broadcast endpoint and decodes every
// reply with decode. It returns the first error reply, if any, with the
// replies decoded so far.
func GatherJSON[T any](ctx context.Context, nc *nats.Conn, subject string, req any, opts GatherOptions) ([]T, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	msgs, err := Gather(ctx, nc, subject, data, opts)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(msgs))
	for _, m := range msgs {
		var v T
		if err := Decode(subject, m, &v); err != nil {
			return out, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Instances returns the ping answer of every running instance of a micro
// service (what `nats micro ls <service>` lists): the answers that arrive
// within timeout (zero means DefaultGatherTimeout), until none came for
// DefaultGap. No instance is not an error.
func Instances(ctx context.Context, nc *nats.Conn, service string, timeout time.Duration) ([]micro.Ping, error) {
	msgs, err := Gather(ctx, nc, PingSubject(service), nil, GatherOptions{Timeout: timeout, Gap: DefaultGap})
	if errors.Is(err, ErrNoReply) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]micro.Ping, 0, len(msgs))
	for _, m := range msgs {
		var p micro.Ping
		if err := json.Unmarshal(m.Data, &p); err != nil {
			return nil, fmt.Errorf("decode ping of %s: %w", service, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// Broadcast sends req to a broadcast endpoint of service and waits for the
// reply of every instance: it first counts the instances with a ping
// (Instances, within timeout/2), then waits for that many replies until
// timeout. An instance that started in between may answer too; one that
// stopped in between makes Broadcast wait for the whole timeout. Zero
// timeout means 2*DefaultGatherTimeout.
func Broadcast[T any](ctx context.Context, nc *nats.Conn, service, subject string, req any, timeout time.Duration) ([]T, error) {
	if timeout <= 0 {
		timeout = 2 * DefaultGatherTimeout
	}
	inst, err := Instances(ctx, nc, service, timeout/2)
	if err != nil {
		return nil, err
	}
	if len(inst) == 0 {
		return nil, fmt.Errorf("%s: %w: no instance of %s runs", subject, ErrNoReply, service)
	}
	return GatherJSON[T](ctx, nc, subject, req, GatherOptions{Want: len(inst), Timeout: timeout})
}

// Kick asks every gateway to close the user's sockets (or one connection)
// and returns every gateway's reply.
func Kick(ctx context.Context, nc *nats.Conn, req admin.KickRequest, timeout time.Duration) ([]admin.KickReply, error) {
	return Broadcast[admin.KickReply](ctx, nc, admin.GatewayService, admin.GatewayKickSubject, req, timeout)
}

// Watchers asks every gateway which of its sockets watch the user.
func Watchers(ctx context.Context, nc *nats.Conn, userID string, timeout time.Duration) ([]admin.WatchersReply, error) {
	return Broadcast[admin.WatchersReply](ctx, nc, admin.GatewayService, admin.GatewayWatchersSubject, admin.UserRequest{UserID: userID}, timeout)
}

// Conns asks one gateway for the user's status and connections.
func Conns(ctx context.Context, nc *nats.Conn, userID string) (admin.ConnsReply, error) {
	var r admin.ConnsReply
	err := Request(ctx, nc, admin.GatewayConnsSubject, admin.UserRequest{UserID: userID}, &r)
	return r, err
}

// Sweep asks one reaper to sweep now, and waits until it is done.
func Sweep(ctx context.Context, nc *nats.Conn) (admin.SweepReply, error) {
	var r admin.SweepReply
	err := Request(ctx, nc, admin.ReaperSweepSubject, struct{}{}, &r)
	return r, err
}

// ErrNoReply means a request got no reply in time: no instance of the
// service runs, or none answered.
var ErrNoReply = errors.New("no reply")

// ServiceError is an error reply of an admin endpoint, as a client sees
// it. It matches admin.ErrBadRequest or admin.ErrUnavailable by its code.
type ServiceError struct {
	// Code is the micro error code ("400", "503", "500").
	Code string
	// Description is the error's text.
	Description string
	// Subject is the subject the request went to.
	Subject string
}

func (e *ServiceError) Error() string {
	return fmt.Sprintf("%s: error %s: %s", e.Subject, e.Code, e.Description)
}

// Is reports whether e is the sentinel its code stands for.
func (e *ServiceError) Is(target error) bool {
	switch e.Code {
	case admin.CodeBadRequest:
		return target == admin.ErrBadRequest
	case admin.CodeUnavailable:
		return target == admin.ErrUnavailable
	}
	return false
}

// Subjects returns every admin subject, for documentation checks and
// permission lists.
func Subjects() []string {
	return []string{
		admin.GatewayInfoSubject, admin.GatewayKickSubject, admin.GatewayConnsSubject, admin.GatewayWatchersSubject,
		admin.ReaperInfoSubject, admin.ReaperSweepSubject, admin.FanoutInfoSubject, admin.WebhooksInfoSubject,
	}
}

// Services returns the micro service names.
func Services() []string {
	return []string{admin.GatewayService, admin.ReaperService, admin.FanoutService, admin.WebhooksService}
}

// PingSubject returns the micro discovery subject every instance of a
// service answers a ping on (`nats micro ping <service>`).
func PingSubject(service string) string { return controlSubject(micro.PingVerb, service) }

// InfoSubject returns the micro discovery subject every instance of a
// service answers its micro.Info on (`nats micro info <service>`).
func InfoSubject(service string) string { return controlSubject(micro.InfoVerb, service) }

// StatsSubject returns the micro discovery subject every instance of a
// service answers its micro.Stats on (`nats micro stats <service>`).
func StatsSubject(service string) string { return controlSubject(micro.StatsVerb, service) }

// controlSubject returns the subject of verb for every instance of
// service, as the micro package names it. It fails only for a verb of its
// own or an instance id without a service, which these never are.
func controlSubject(verb micro.Verb, service string) string {
	subject, _ := micro.ControlSubject(verb, service, "")
	return subject
}
