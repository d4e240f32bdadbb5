package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// Default timings of a Client.
const (
	DefaultDrainJitter  = time.Second
	DefaultStableAfter  = 10 * time.Second
	DefaultEventBuffer  = 256
	DefaultWriteTimeout = 10 * time.Second
	// DefaultHeartbeatInterval and DefaultTTL apply when a hello frame
	// carries no heartbeat_interval_ms or ttl_ms.
	DefaultHeartbeatInterval = 15 * time.Second
	DefaultTTL               = 30 * time.Second
)

// Config configures Connect. It says who the client is (Token, TokenFunc
// or User); every other field may be left zero.
type Config struct {
	// Token is a JWT proving the user, sent as Authorization: Bearer.
	Token string
	// TokenFunc, when set, is called before every connection attempt for a
	// fresh token, instead of Token. An error from it fails that attempt,
	// which is retried. It is also called while a connection is open, when
	// a third of its token's life is left (to the JWT's exp claim), and the
	// fresh token is sent on the connection in an auth message, so that
	// the connection outlives its token; a call that fails, or gives a
	// token expiring no later than the one in use, is tried again with
	// Backoff while that token lasts. A token that is not a JWT with an
	// exp claim is not renewed in place. A connection closed because its
	// token expired (1008 "token expired") or because the gateway refused
	// a renewed one (1008 "unauthorized") is opened again with a new token
	// rather than given up. Calls never overlap.
	TokenFunc func(ctx context.Context) (string, error)
	// User is the user id on a gateway with dev auth (?user=), instead of
	// a token.
	User string
	// Device names this device in the user's own view (?device=): web,
	// ios, desktop, ...
	Device string
	// Platform is the platform this device is on (?platform=): web,
	// desktop or mobile; others see it in the user's presence.
	Platform presence.Platform
	// Header holds extra request headers (Origin).
	Header http.Header
	// LocalAddr is the local address to dial from.
	LocalAddr net.Addr
	// Compression offers permessage-deflate on every connection (see
	// Options.Compression): the gateway's large frames (presence_init,
	// room_state) then come compressed, inflated transparently.
	Compression bool
	// DialTimeout bounds one connection attempt: dial, upgrade and hello.
	// Zero means 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds one write to the socket. Zero means 10s.
	WriteTimeout time.Duration
	// KeepActive sends activity instead of heartbeat, so the user is never
	// made away automatically for lack of activity: for services and bots
	// that are present while they run. Without it, call Activity when the
	// person is active.
	KeepActive bool
	// Backoff bounds the waits between reconnect attempts.
	Backoff Backoff
	// DrainJitter bounds the random wait before reconnecting when the
	// gateway drains (close 1001); zero means 1s. The backoff starts over.
	DrainJitter time.Duration
	// StableAfter is how long a connection must have lasted for the
	// backoff to start over when it is lost; zero means 10s. A gateway
	// that accepts and drops at once is not hammered.
	StableAfter time.Duration
	// EventBuffer is the capacity of the Events channel; zero means 256.
	// Events that do not fit are dropped and counted (see Lagged).
	EventBuffer int
}

// withDefaults fills the zero fields of cfg and checks it.
func (cfg Config) withDefaults() (Config, error) {
	hasToken := cfg.Token != "" || cfg.TokenFunc != nil
	switch {
	case !hasToken && cfg.User == "":
		return cfg, errors.New("no identity: set Token, TokenFunc or User")
	case hasToken && cfg.User != "":
		return cfg, errors.New("set a token or User (dev auth), not both")
	case cfg.User != "" && !presence.ValidUserID(cfg.User):
		return cfg, fmt.Errorf("user id %q: want 1 to %d characters of A-Z a-z 0-9 _ -", cfg.User, presence.MaxUserIDLen)
	case cfg.Device != "" && !presence.ValidDevice(cfg.Device):
		return cfg, fmt.Errorf("device %q: want 1 to %d characters of A-Z a-z 0-9 _ - . and space", cfg.Device, presence.MaxDeviceLen)
	case cfg.Platform != "" && !presence.ValidPlatform(string(cfg.Platform)):
		return cfg, fmt.Errorf("platform %q: want web, desktop or mobile", cfg.Platform)
	case cfg.DialTimeout < 0, cfg.WriteTimeout < 0, cfg.DrainJitter < 0, cfg.StableAfter < 0:
		return cfg, errors.New("timeouts and waits must not be negative")
	case cfg.EventBuffer < 0:
		return cfg, fmt.Errorf("event buffer %d is negative", cfg.EventBuffer)
	}
	var err error
	if cfg.Backoff, err = cfg.Backoff.withDefaults(); err != nil {
		return cfg, err
	}
	cfg.DialTimeout = cmp.Or(cfg.DialTimeout, 10*time.Second)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, DefaultWriteTimeout)
	cfg.DrainJitter = cmp.Or(cfg.DrainJitter, DefaultDrainJitter)
	cfg.StableAfter = cmp.Or(cfg.StableAfter, DefaultStableAfter)
	cfg.EventBuffer = cmp.Or(cfg.EventBuffer, DefaultEventBuffer)
	return cfg, nil
}

// gatewayURL returns the URL to dial: raw with the path /ws when it has
// none, and the user and device in the query.
func gatewayURL(raw string, cfg Config) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("bad url %q: %w", raw, err)
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("bad url %q: the scheme must be ws, wss, http or https", raw)
	}
	if u.Host == "" {
		return "", fmt.Errorf("bad url %q: no host", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/ws"
	}
	u.Fragment = ""
	q := u.Query()
	if cfg.User != "" {
		q.Set("user", cfg.User)
	}
	if cfg.Device != "" {
		q.Set("device", cfg.Device)
	}
	if cfg.Platform != "" {
		q.Set("platform", string(cfg.Platform))
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}
