package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http/httpguts"

	"github.com/greendot/greendot/gateway/internal/authz"
	"github.com/greendot/greendot/pkg/presence"
)

// Policy says who may watch whom.
type Policy = authz.Policy

// The policies.
const (
	// PolicyMutual lets A watch B only when A follows B and B follows A. It
	// is the default.
	PolicyMutual = authz.Mutual
	// PolicyFollow lets A watch B when A follows B.
	PolicyFollow = authz.Follow
	// PolicyEveryone lets anyone watch anyone, and enables global presence
	// (subscribe with "all": true, GET /api/presence/online).
	PolicyEveryone = authz.Everyone
	// PolicyToken lets A watch B when A's token lists B in its watch
	// claim (Config.TokenMaxWatch bounds the list). It needs Tokens to be
	// a WatchVerifier.
	PolicyToken = authz.Token
	// PolicyApp lets A watch B when the app, asked over HTTP (AppURL) or
	// NATS (AppSubject), says so.
	PolicyApp = authz.App
)

// InvalidateSubject is the NATS subject on which the app drops cached
// answers of the app policy: every gateway listens on it. Its messages are
// JSON objects {"watcher": "<id>", "target": "<id>"}, each field optional
// (an absent one matches anyone; {} drops every answer).
const InvalidateSubject = "greendot.authz.invalidate"

// ParsePolicy parses a policy name.
func ParsePolicy(s string) (Policy, error) {
	p, err := authz.ParsePolicy(s)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return p, nil
}

// Config configures a gateway. The zero value is usable, but admits nobody:
// set DevAuth or Tokens.
type Config struct {
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// Buckets says how buckets are created if they are missing.
	Buckets presence.BucketOptions
	// ID names this gateway in connection records and subjects; empty means
	// a random id. 1 to 64 characters of A-Z a-z 0-9 _ -.
	ID string

	// HeartbeatInterval is how often clients are asked to send a
	// heartbeat; zero means 15s, or ConnTTL/2 when that is shorter.
	HeartbeatInterval time.Duration
	// ConnTTL is how long a connection stays live without a frame from its
	// client; zero means 30s. At least 1s; it is rounded up to whole
	// seconds, the unit of JetStream TTLs.
	ConnTTL time.Duration
	// LeaseTTL is how long the gateway's lease outlives its last refresh
	// (about every second): when the gateway dies, or loses NATS for
	// longer, its users go offline after this. Zero means ConnTTL; at
	// least 1s, at most ConnTTL. Rounded up to whole seconds.
	LeaseTTL time.Duration
	// OfflineGrace is how long a cleanly closed connection still counts,
	// so that a page reload does not flap; zero means 3s, NoOfflineGrace
	// none. Rounded up to whole seconds.
	OfflineGrace time.Duration
	// BackgroundGrace is the longest grace a client may ask for when it
	// says its app goes to the background (background): when such a
	// connection's socket then closes or dies, the user is shown away,
	// not offline, until the grace ends. A client that asks for no grace
	// gets this one. Zero means 2m.
	BackgroundGrace time.Duration
	// AwayAfter is how long a connection may go without activity before
	// it counts as idle; zero means 5m.
	AwayAfter time.Duration
	// BatchInterval is the least time between two frames of changes to
	// one watching socket, changes that come sooner coalescing until it
	// has passed; zero means 10ms.
	BatchInterval time.Duration
	// BatchPace is the time between frames to a socket whose changes come
	// continuously: after a quiet spell a socket may have a few frames
	// (outbox.PaceBurst) a batch interval apart, then one per BatchPace,
	// its changes coalescing. Zero means 50ms or BatchInterval, whichever
	// is longer; it may not be shorter than BatchInterval.
	BatchPace time.Duration

	// DevAuth accepts ?user=<id> as the identity of a WebSocket or HTTP
	// client, with no proof. Only for development. A request then must
	// name (Host) an IP address, localhost, a name under .localhost or one
	// of DevAuthHosts: a web page of another name, made to point to this
	// machine (DNS rebinding), must not act as any user.
	DevAuth bool
	// DevAuthHosts are the further host names (no port) a gateway with
	// DevAuth answers requests for.
	DevAuthHosts []string
	// Tokens verifies bearer tokens (JWTs); nil accepts none.
	Tokens TokenVerifier
	// AllowedOrigins lists the Origin values a browser may connect from
	// ("https://app.example.com", or "*" for any). Empty allows any.
	AllowedOrigins []string
	// Policy says who may watch whom; empty means PolicyMutual.
	Policy Policy
	// AuthzCacheTTL bounds how long an authorization decision and a
	// user's privacy settings are cached; zero means 5s. Graph changes
	// seen by the gateway's watcher take effect sooner.
	AuthzCacheTTL time.Duration
	// TokenMaxWatch bounds the user ids of a token's watch claim under
	// PolicyToken: a token with more is refused. Zero means 1000.
	TokenMaxWatch int
	// AppURL is where the app policy POSTs its questions; AppSubject the
	// NATS subject it sends them to instead. Exactly one is set under
	// PolicyApp.
	AppURL, AppSubject string
	// AppSecret signs the questions POSTed to AppURL and verifies the
	// app's calls of POST /api/authz/invalidate (at least 32 bytes). It is
	// needed with AppURL; without it, with AppSubject, the HTTP
	// invalidation is not served.
	AppSecret []byte
	// AppTimeout bounds one question to the app, retries included; zero
	// means 2s.
	AppTimeout time.Duration
	// AppCacheTTL bounds how long an answer of the app is cached, per
	// watcher and target; zero means 1m. An invalidation drops it sooner.
	AppCacheTTL time.Duration
	// ConnectProxyURL, when set, is where the gateway POSTs, signed with
	// AppSecret, the question of who a client is whose upgrade request
	// carries no token: the request's cookies and ConnectProxyHeaders
	// are forwarded, and the app answers with a user id, an expiry and
	// optionally a token's claims (watch, rooms), or a refusal (see
	// connectproxy.go). ConnectProxySubject is the NATS subject it sends
	// them to instead. At most one is set.
	ConnectProxyURL, ConnectProxySubject string
	// ConnectProxyHeaders are the request headers forwarded to the
	// connect proxy besides Cookie.
	ConnectProxyHeaders []string
	// ConnectProxyTimeout bounds one question to the connect proxy,
	// retries included; less than HandshakeTimeout. Zero means 2s.
	ConnectProxyTimeout time.Duration

	// NoCompression declines permessage-deflate (RFC 7692): a client that
	// offers it gets no extension, and every frame goes uncompressed. By
	// default a client that offers it (every browser) gets it, with no
	// context takeover either way (see docs/protocol.md).
	NoCompression bool

	// MaxMessageSize is the largest client message, in bytes; zero means
	// 4096.
	MaxMessageSize int
	// MaxSubscriptions bounds the subscriptions of one socket; zero means
	// 500.
	MaxSubscriptions int
	// MaxSubscribeIDs bounds the ids of one subscribe message; zero means
	// 100.
	MaxSubscribeIDs int
	// MaxQueryIDs bounds the ids of one POST /api/presence/query; zero
	// means 500.
	MaxQueryIDs int
	// OnlineLimit bounds the users listed by global presence; zero means
	// 1000.
	OnlineLimit int
	// RoomMetaMax bounds the meta of a connection in a room, a JSON
	// object, in bytes (compacted); zero means 1024.
	RoomMetaMax int
	// MaxRoomsPerConn bounds the rooms one connection may be in; zero
	// means 10.
	MaxRoomsPerConn int
	// RoomMembersMax bounds the users a room_state lists; zero means
	// 100. Beyond it the state is truncated.
	RoomMembersMax int
	// RoomUpdateRate is how many room_update messages per second a socket
	// may send on average, and RoomUpdateBurst how many at once; zero
	// means 10 and 20.
	RoomUpdateRate  float64
	RoomUpdateBurst int
	// SignalRate is how many typing and signal messages per second a
	// socket may send on average, and SignalBurst how many at once; zero
	// means 5 and 10.
	SignalRate  float64
	SignalBurst int
	// MaxConns bounds the connections of this gateway (503 when full); zero
	// means no bound.
	MaxConns int
	// MaxConnsPerUser bounds the connections of one user on this gateway;
	// zero means 32.
	MaxConnsPerUser int
	// RateLimit is how many frames per second a socket may send on
	// average, every frame counted (a message, each of its fragments, a
	// ping, a pong); zero means 20. RateBurst is how many it may send at
	// once; zero means 40.
	RateLimit float64
	RateBurst int
	// RateStrikes is how many rate_limited errors of RateLimit a socket
	// may earn within a minute before it is closed with 1008 (those of the
	// room update, signal and waiting-request limits do not count); zero
	// means 10.
	RateStrikes int
	// APIRateLimit is how many HTTP API requests per second one identity
	// may make on average, and APIRateBurst how many at once; zero means
	// 20 and 40. APIAddressRateLimit and APIAddressRateBurst bound the
	// same per source address, before the request is authenticated; zero
	// means 200 and 400. A request beyond either is answered 429 with
	// Retry-After.
	APIRateLimit        float64
	APIRateBurst        int
	APIAddressRateLimit float64
	APIAddressRateBurst int
	// TLSCertFile and TLSKeyFile, when set, are the PEM files of the
	// certificate (with its chain) and key the gateway serves TLS with:
	// wss:// and https:// on its listen address, with no proxy in front.
	// They are read at the start, where files that cannot be read stop
	// the gateway, and again when they change (looked at every
	// TLSReload at most, zero meaning 5s), where files that cannot be read
	// keep the certificate before.
	TLSCertFile, TLSKeyFile string
	TLSReload               time.Duration
	// TrustedProxies are the addresses of the deployment's load balancers
	// and reverse proxies: a request from one of them is taken to come
	// from the address its Forwarded or X-Forwarded-For header names (the
	// nearest one not trusted), for the per-address limits and the logs.
	// A request from any other address is taken to come from there,
	// whatever its headers say.
	TrustedProxies []netip.Prefix
	// APIKeysFile, when set, is a file of keys a backend calls the server
	// API (/api/server/) with, each with its scopes (see docs/integration.md);
	// it is read at the start, where a bad one stops the gateway, and again
	// every APIKeysRefresh (zero means 5s) when it changed, where a bad one
	// keeps the keys before. Without it the server API is not served.
	APIKeysFile    string
	APIKeysRefresh time.Duration
	// APIKeyRateLimit is how many server API requests per second one key
	// may make on average, and APIKeyRateBurst how many at once, apart
	// from users' limits; zero means 200 and 400.
	APIKeyRateLimit float64
	APIKeyRateBurst int
	// MaxRegistering bounds the upgrades being registered in NATS at once
	// (each creates a connection key and updates a status record before
	// it is answered). An upgrade beyond it is refused with 503 at once:
	// in a reconnect storm the gateway then does only the work NATS can
	// finish in time, instead of starting every registration and letting
	// them all time out. The upgrades waiting for a connect proxy's answer
	// are bounded by the same number, apart. Zero means
	// DefaultMaxRegistering.
	MaxRegistering int
	// HandshakeTimeout bounds the time from accepting a TCP connection to
	// the end of its WebSocket handshake or of its first HTTP request (head
	// and body), each later request from its first bytes, and how long a
	// kept-alive HTTP connection may be idle; zero means 10s.
	HandshakeTimeout time.Duration
	// WriteTimeout is how long a socket may take nothing of the frames
	// that wait for it before it is closed as too slow: a write never
	// waits for a slow peer, what the kernel does not take waits in the
	// socket's backlog (at most 1 MiB), the socket's changes coalesce and
	// it is not read meanwhile (nor ended by the TTL). (Where the gateway
	// has no poller, off Linux, each write waits, for at most this long.)
	// Zero means 10s.
	WriteTimeout time.Duration
	// ReadWorkers bounds how many sockets are read at once: the goroutines
	// that read readable sockets, started as needed and kept; zero means
	// 256.
	ReadWorkers int
	// MemoryTrimInterval is how often the gateway looks whether its process
	// is quiet and holds free memory worth giving back to the operating
	// system (see memtrim.go); zero never does. It is process-wide (it
	// collects and returns the whole process's free heap), so unlike the
	// other fields zero is not replaced by the default: DefaultConfig has
	// DefaultMemoryTrimInterval, a Config of an app's own has none.
	MemoryTrimInterval time.Duration
	// WriteWorkers bounds how many sockets are written to at once by the
	// batch flusher; a write never waits for its peer (see WriteTimeout).
	// Zero means 64.
	WriteWorkers int
	// KVMaxPending bounds the asynchronous connection key writes in flight;
	// zero means 4096.
	KVMaxPending int
	// Static, when set, serves every HTTP path the API does not (the
	// browser client and the demo page).
	Static http.Handler
	// Metrics, when set, is what GET /metrics serves instead of the
	// gateway's own registry (Registry): standalone mode gathers every
	// process's metrics there.
	Metrics prometheus.Gatherer
	// Readyz, when set, is what GET /readyz reports instead of the
	// gateway's own readiness (Ready): standalone mode reports there every
	// part it runs, naming the one that is not ready with a
	// metrics.PartNotReady. The gateway's admin service still reports its
	// own.
	Readyz func(ctx context.Context) error
	// DrainPeriod is how long a stopping gateway spreads the closing of its
	// sockets over, so that clients reconnect elsewhere gradually; zero
	// means 0 (all at once).
	DrainPeriod time.Duration

	// buffers sizes the channels NATS hands messages to (export_test.go
	// makes them small for tests); zero means the defaults.
	buffers buffers
}

// buffers are how many messages wait for the goroutine that takes them
// before NATS drops them: far more than a gateway gets in the time it
// takes to hand them on, and 512 KiB of pointers each.
type buffers struct {
	// events are presence and self events, for the dispatcher.
	events int
	// roomMsgs are the rooms' events and signals, for the room hub.
	roomMsgs int
}

// defaultBuffer is the size of a buffer left zero.
const defaultBuffer = 64 * 1024

// maxBackgroundGrace bounds Config.BackgroundGrace: a grace is kept in
// a connection's registration as 32 bits of milliseconds.
const maxBackgroundGrace = 24 * time.Hour

// NoOfflineGrace, as Config.OfflineGrace, ends a cleanly closed connection
// at once (zero means the default grace).
const NoOfflineGrace time.Duration = -1

// The defaults of Config, as DefaultConfig returns them.
const (
	DefaultHeartbeatInterval = 15 * time.Second
	DefaultConnTTL           = 30 * time.Second
	DefaultOfflineGrace      = 3 * time.Second
	DefaultBackgroundGrace   = 2 * time.Minute
	DefaultAwayAfter         = 5 * time.Minute
	DefaultBatchInterval     = 10 * time.Millisecond
	// DefaultBatchPace is the batch pace when BatchInterval is no longer.
	DefaultBatchPace = 50 * time.Millisecond
	// DefaultMemoryTrimInterval is DefaultConfig's MemoryTrimInterval.
	DefaultMemoryTrimInterval  = 10 * time.Second
	DefaultMaxMessageSize      = 4096
	DefaultMaxSubscriptions    = 500
	DefaultMaxSubscribeIDs     = 100
	DefaultMaxQueryIDs         = 500
	DefaultOnlineLimit         = 1000
	DefaultMaxConnsPerUser     = 32
	DefaultMaxRegistering      = 128
	DefaultTokenMaxWatch       = 1000
	DefaultAppTimeout          = 2 * time.Second
	DefaultAppCacheTTL         = time.Minute
	DefaultConnectProxyTimeout = 2 * time.Second
	DefaultRoomMetaMax         = 1024
	DefaultMaxRoomsPerConn     = 10
	DefaultRoomMembersMax      = 100
	DefaultRoomUpdateRate      = 10
	DefaultRoomUpdateBurst     = 20
	DefaultSignalRate          = 5
	DefaultSignalBurst         = 10
)

// MinAppSecretLen is the shortest AppSecret accepted, in bytes.
const MinAppSecretLen = 32

// DefaultConfig returns the configuration every zero field of a Config
// stands for. The command line's flags take their defaults from it. Two
// defaults depend on other fields, so they are not in it: the gateway ID
// (random) and, when ConnTTL is shorter than 30s, the heartbeat interval
// (half of ConnTTL).
func DefaultConfig() Config {
	return Config{
		HeartbeatInterval:   DefaultHeartbeatInterval,
		ConnTTL:             DefaultConnTTL,
		OfflineGrace:        DefaultOfflineGrace,
		BackgroundGrace:     DefaultBackgroundGrace,
		AwayAfter:           DefaultAwayAfter,
		BatchInterval:       DefaultBatchInterval,
		Policy:              PolicyMutual,
		AuthzCacheTTL:       5 * time.Second,
		TokenMaxWatch:       DefaultTokenMaxWatch,
		AppTimeout:          DefaultAppTimeout,
		AppCacheTTL:         DefaultAppCacheTTL,
		ConnectProxyTimeout: DefaultConnectProxyTimeout,
		MaxMessageSize:      DefaultMaxMessageSize,
		MaxSubscriptions:    DefaultMaxSubscriptions,
		MaxSubscribeIDs:     DefaultMaxSubscribeIDs,
		MaxQueryIDs:         DefaultMaxQueryIDs,
		OnlineLimit:         DefaultOnlineLimit,
		MaxConnsPerUser:     DefaultMaxConnsPerUser,
		RoomMetaMax:         DefaultRoomMetaMax,
		MaxRoomsPerConn:     DefaultMaxRoomsPerConn,
		RoomMembersMax:      DefaultRoomMembersMax,
		RoomUpdateRate:      DefaultRoomUpdateRate,
		RoomUpdateBurst:     DefaultRoomUpdateBurst,
		SignalRate:          DefaultSignalRate,
		SignalBurst:         DefaultSignalBurst,
		MaxRegistering:      DefaultMaxRegistering,
		RateLimit:           20,
		RateBurst:           40,
		RateStrikes:         10,
		APIRateLimit:        20,
		APIRateBurst:        40,
		APIAddressRateLimit: 200,
		APIAddressRateBurst: 400,
		APIKeysRefresh:      5 * time.Second,
		TLSReload:           5 * time.Second,
		APIKeyRateLimit:     200,
		APIKeyRateBurst:     400,
		HandshakeTimeout:    10 * time.Second,
		WriteTimeout:        10 * time.Second,
		ReadWorkers:         256,
		MemoryTrimInterval:  DefaultMemoryTrimInterval,
		WriteWorkers:        64,
		KVMaxPending:        4096,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.buffers.events == 0 {
		c.buffers.events = defaultBuffer
	}
	if c.buffers.roomMsgs == 0 {
		c.buffers.roomMsgs = defaultBuffer
	}
	if c.ID == "" {
		// A whole nuid: its first 12 characters are the same for every
		// id made by one process, so a prefix would give every gateway of
		// a process (standalone mode, tests) the same id.
		c.ID = "gw-" + nuid.Next()
	}
	c.ConnTTL = presence.TTLSeconds(cmp.Or(c.ConnTTL, d.ConnTTL))
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = min(d.HeartbeatInterval, c.ConnTTL/2)
	}
	c.LeaseTTL = presence.TTLSeconds(cmp.Or(c.LeaseTTL, c.ConnTTL))
	c.OfflineGrace = cmp.Or(c.OfflineGrace, d.OfflineGrace)
	if c.OfflineGrace > 0 {
		c.OfflineGrace = presence.TTLSeconds(c.OfflineGrace)
	}
	c.BackgroundGrace = cmp.Or(c.BackgroundGrace, d.BackgroundGrace)
	c.AwayAfter = cmp.Or(c.AwayAfter, d.AwayAfter)
	c.BatchInterval = cmp.Or(c.BatchInterval, d.BatchInterval)
	if c.BatchPace == 0 {
		c.BatchPace = max(DefaultBatchPace, c.BatchInterval)
	}
	c.Policy = cmp.Or(c.Policy, d.Policy)
	c.AuthzCacheTTL = cmp.Or(c.AuthzCacheTTL, d.AuthzCacheTTL)
	c.TokenMaxWatch = cmp.Or(c.TokenMaxWatch, d.TokenMaxWatch)
	c.AppTimeout = cmp.Or(c.AppTimeout, d.AppTimeout)
	c.AppCacheTTL = cmp.Or(c.AppCacheTTL, d.AppCacheTTL)
	c.ConnectProxyTimeout = cmp.Or(c.ConnectProxyTimeout, d.ConnectProxyTimeout)
	c.MaxMessageSize = cmp.Or(c.MaxMessageSize, d.MaxMessageSize)
	c.MaxSubscriptions = cmp.Or(c.MaxSubscriptions, d.MaxSubscriptions)
	c.MaxSubscribeIDs = cmp.Or(c.MaxSubscribeIDs, d.MaxSubscribeIDs)
	c.MaxQueryIDs = cmp.Or(c.MaxQueryIDs, d.MaxQueryIDs)
	c.OnlineLimit = cmp.Or(c.OnlineLimit, d.OnlineLimit)
	c.MaxConnsPerUser = cmp.Or(c.MaxConnsPerUser, d.MaxConnsPerUser)
	c.RoomMetaMax = cmp.Or(c.RoomMetaMax, d.RoomMetaMax)
	c.MaxRoomsPerConn = cmp.Or(c.MaxRoomsPerConn, d.MaxRoomsPerConn)
	c.RoomMembersMax = cmp.Or(c.RoomMembersMax, d.RoomMembersMax)
	c.RoomUpdateRate = cmp.Or(c.RoomUpdateRate, d.RoomUpdateRate)
	c.RoomUpdateBurst = cmp.Or(c.RoomUpdateBurst, d.RoomUpdateBurst)
	c.SignalRate = cmp.Or(c.SignalRate, d.SignalRate)
	c.SignalBurst = cmp.Or(c.SignalBurst, d.SignalBurst)
	c.MaxRegistering = cmp.Or(c.MaxRegistering, d.MaxRegistering)
	c.RateLimit = cmp.Or(c.RateLimit, d.RateLimit)
	c.RateBurst = cmp.Or(c.RateBurst, d.RateBurst)
	c.RateStrikes = cmp.Or(c.RateStrikes, d.RateStrikes)
	c.APIRateLimit = cmp.Or(c.APIRateLimit, d.APIRateLimit)
	c.APIRateBurst = cmp.Or(c.APIRateBurst, d.APIRateBurst)
	c.APIAddressRateLimit = cmp.Or(c.APIAddressRateLimit, d.APIAddressRateLimit)
	c.APIAddressRateBurst = cmp.Or(c.APIAddressRateBurst, d.APIAddressRateBurst)
	c.APIKeysRefresh = cmp.Or(c.APIKeysRefresh, d.APIKeysRefresh)
	c.TLSReload = cmp.Or(c.TLSReload, d.TLSReload)
	c.APIKeyRateLimit = cmp.Or(c.APIKeyRateLimit, d.APIKeyRateLimit)
	c.APIKeyRateBurst = cmp.Or(c.APIKeyRateBurst, d.APIKeyRateBurst)
	c.HandshakeTimeout = cmp.Or(c.HandshakeTimeout, d.HandshakeTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, d.WriteTimeout)
	c.ReadWorkers = cmp.Or(c.ReadWorkers, d.ReadWorkers)
	c.WriteWorkers = cmp.Or(c.WriteWorkers, d.WriteWorkers)
	c.KVMaxPending = cmp.Or(c.KVMaxPending, d.KVMaxPending)
	return c
}

// negativeRate reports whether r is not a rate: below zero, or NaN, which
// a limiter would take for no limit at all.
func negativeRate(r float64) bool { return !(r >= 0) }

// Validate reports whether c is usable. Every error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return bad("TLS needs both a certificate file and a key file")
	}
	if c.TLSReload < 0 {
		return bad("TLS reload %v: want a positive duration", c.TLSReload)
	}
	for _, p := range c.TrustedProxies {
		if !p.IsValid() {
			return bad("trusted proxy %v: not an address prefix", p)
		}
	}
	ttl := presence.TTLSeconds(cmp.Or(c.ConnTTL, DefaultConnTTL))
	switch {
	case c.ID != "" && !presence.ValidToken(c.ID):
		return bad("gateway id %q: want 1 to 64 characters of A-Z a-z 0-9 _ -", c.ID)
	case c.ConnTTL < 0 || c.ConnTTL > 0 && c.ConnTTL < time.Second:
		return bad("connection TTL %v: want at least 1s", c.ConnTTL)
	case c.HeartbeatInterval < 0:
		return bad("heartbeat interval %v: want a positive duration", c.HeartbeatInterval)
	case c.HeartbeatInterval > 0 && c.HeartbeatInterval >= ttl:
		return bad("heartbeat interval %v: want less than the connection TTL %v", c.HeartbeatInterval, ttl)
	case c.LeaseTTL < 0 || c.LeaseTTL > 0 && c.LeaseTTL < time.Second:
		return bad("lease TTL %v: want at least 1s", c.LeaseTTL)
	case c.LeaseTTL > 0 && presence.TTLSeconds(c.LeaseTTL) > ttl:
		return bad("lease TTL %v: want at most the connection TTL %v", c.LeaseTTL, ttl)
	case c.OfflineGrace < 0 && c.OfflineGrace != NoOfflineGrace:
		return bad("offline grace %v: want a positive duration, or NoOfflineGrace", c.OfflineGrace)
	case c.BackgroundGrace < 0 || c.BackgroundGrace > maxBackgroundGrace:
		return bad("background grace %v: want a positive duration of at most %v", c.BackgroundGrace, maxBackgroundGrace)
	case c.AwayAfter < 0 || c.AwayAfter > 0 && c.AwayAfter < time.Second:
		return bad("away-after %v: want at least 1s", c.AwayAfter)
	case c.BatchInterval < 0 || c.BatchInterval > 0 && c.BatchInterval < time.Millisecond:
		return bad("batch interval %v: want at least 1ms", c.BatchInterval)
	case c.BatchInterval > 10*time.Second:
		return bad("batch interval %v: want at most 10s", c.BatchInterval)
	case c.BatchPace < 0 || c.BatchPace > 0 && c.BatchPace < c.BatchInterval:
		return bad("batch pace %v: want at least the batch interval (%v)", c.BatchPace, c.BatchInterval)
	case c.BatchPace > 10*time.Second:
		return bad("batch pace %v: want at most 10s", c.BatchPace)
	case c.AuthzCacheTTL < 0:
		return bad("authorization cache TTL %v: want a positive duration", c.AuthzCacheTTL)
	case c.MaxMessageSize < 0 || c.MaxMessageSize > 0 && c.MaxMessageSize < 256 || c.MaxMessageSize > 1<<20:
		return bad("max message size %d: want 256 to 1048576 bytes", c.MaxMessageSize)
	case c.MaxSubscriptions < 0 || c.MaxSubscribeIDs < 0 || c.MaxQueryIDs < 0 || c.OnlineLimit < 0:
		return bad("limits must not be negative")
	case c.RoomMetaMax < 0 || c.MaxRoomsPerConn < 0 || c.RoomMembersMax < 0 || negativeRate(c.RoomUpdateRate) || c.RoomUpdateBurst < 0 ||
		negativeRate(c.SignalRate) || c.SignalBurst < 0:
		return bad("room limits must not be negative or NaN")
	case c.MaxConns < 0 || c.MaxConnsPerUser < 0 || c.MaxRegistering < 0:
		return bad("connection limits must not be negative")
	case negativeRate(c.RateLimit) || c.RateBurst < 0 || c.RateStrikes < 0,
		negativeRate(c.APIRateLimit) || c.APIRateBurst < 0 || negativeRate(c.APIAddressRateLimit) || c.APIAddressRateBurst < 0,
		negativeRate(c.APIKeyRateLimit) || c.APIKeyRateBurst < 0 || c.APIKeysRefresh < 0:
		return bad("rate limits must not be negative or NaN")
	case c.HandshakeTimeout < 0 || c.WriteTimeout < 0 || c.DrainPeriod < 0:
		return bad("timeouts must not be negative")
	case c.MemoryTrimInterval < 0:
		return bad("memory trim interval %v: want 0 (never) or more", c.MemoryTrimInterval)
	case c.ReadWorkers < 0 || c.WriteWorkers < 0 || c.KVMaxPending < 0:
		return bad("worker counts must not be negative")
	}
	if c.Policy != "" {
		if _, err := ParsePolicy(string(c.Policy)); err != nil {
			return err
		}
	}
	if err := c.validateExternal(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	for _, o := range c.AllowedOrigins {
		if err := checkAllowedOrigin(o); err != nil {
			return bad("allowed origin %q: %v", o, err)
		}
	}
	for _, h := range c.DevAuthHosts {
		if h == "" || strings.ContainsAny(h, ":/[] ") {
			return bad("dev auth host %q: want a host name, without scheme or port", h)
		}
	}
	if err := c.Buckets.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return nil
}

// validateExternal checks the settings of the token and app policies.
func (c Config) validateExternal() error {
	switch {
	case c.TokenMaxWatch < 0:
		return fmt.Errorf("token watch limit %d: must not be negative", c.TokenMaxWatch)
	case c.AppTimeout < 0 || c.AppCacheTTL < 0:
		return errors.New("app timeout and cache TTL must not be negative")
	case len(c.AppSecret) > 0 && len(c.AppSecret) < MinAppSecretLen:
		return fmt.Errorf("app secret is %d bytes: want at least %d", len(c.AppSecret), MinAppSecretLen)
	}
	if err := c.validateConnectProxy(); err != nil {
		return err
	}
	if c.Policy == PolicyToken {
		_, ok := c.Tokens.(WatchVerifier)
		if !ok && (c.Tokens != nil || !c.connectProxy()) {
			return errors.New("policy token needs tokens that carry a watch claim: configure JWT verification (or a connect proxy, whose answers carry one)")
		}
	}
	if c.Policy != PolicyApp {
		if c.AppURL != "" || c.AppSubject != "" {
			return fmt.Errorf("an app URL or subject is only used by policy app, not %s", cmp.Or(c.Policy, PolicyMutual))
		}
		return nil
	}
	switch {
	case c.AppURL == "" && c.AppSubject == "":
		return errors.New("policy app needs an app URL or an app NATS subject to ask")
	case c.AppURL != "" && c.AppSubject != "":
		return errors.New("policy app asks either an app URL or an app NATS subject, not both")
	case c.AppURL != "":
		u, err := url.Parse(c.AppURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("app URL %q: want an http:// or https:// URL", c.AppURL)
		}
		if len(c.AppSecret) == 0 {
			return errors.New("an app URL needs an app secret to sign its questions")
		}
	default:
		if !validSubject(c.AppSubject) {
			return fmt.Errorf("app subject %q: want a NATS subject without wildcards", c.AppSubject)
		}
	}
	return nil
}

// connectProxy reports whether c asks a connect proxy.
func (c Config) connectProxy() bool { return c.ConnectProxyURL != "" || c.ConnectProxySubject != "" }

// validateConnectProxy checks the settings of the connect proxy.
func (c Config) validateConnectProxy() error {
	if !c.connectProxy() {
		if len(c.ConnectProxyHeaders) > 0 {
			return errors.New("connect proxy headers need a connect proxy URL or subject")
		}
		return nil
	}
	hsTimeout := cmp.Or(c.HandshakeTimeout, DefaultConfig().HandshakeTimeout)
	switch {
	case c.ConnectProxyURL != "" && c.ConnectProxySubject != "":
		return errors.New("the connect proxy asks either a URL or a NATS subject, not both")
	case c.DevAuth:
		return errors.New("the connect proxy and dev auth both admit clients that send no token: choose one")
	case c.ConnectProxyTimeout < 0:
		return errors.New("connect proxy timeout must not be negative")
	case cmp.Or(c.ConnectProxyTimeout, DefaultConnectProxyTimeout) >= hsTimeout:
		return fmt.Errorf("connect proxy timeout %v: want less than the handshake timeout %v, which bounds the whole upgrade",
			cmp.Or(c.ConnectProxyTimeout, DefaultConnectProxyTimeout), hsTimeout)
	case c.ConnectProxyURL != "":
		u, err := url.Parse(c.ConnectProxyURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("connect proxy URL %q: want an http:// or https:// URL", c.ConnectProxyURL)
		}
		if len(c.AppSecret) == 0 {
			return errors.New("a connect proxy URL needs an app secret to sign its questions")
		}
	default:
		if !validSubject(c.ConnectProxySubject) {
			return fmt.Errorf("connect proxy subject %q: want a NATS subject without wildcards", c.ConnectProxySubject)
		}
	}
	seen := map[string]bool{}
	for _, h := range c.ConnectProxyHeaders {
		k := textproto.CanonicalMIMEHeaderKey(h)
		switch {
		case !httpguts.ValidHeaderFieldName(h):
			return fmt.Errorf("connect proxy header %q: not a header name", h)
		case k == "Cookie":
			return errors.New("connect proxy header Cookie: the cookies are always forwarded")
		case seen[k]:
			return fmt.Errorf("connect proxy header %s: listed twice", k)
		}
		seen[k] = true
	}
	return nil
}

// validSubject reports whether s is a NATS subject without wildcards.
func validSubject(s string) bool {
	return s != "" && !strings.ContainsAny(s, " \t\r\n*>") && !strings.HasPrefix(s, ".") &&
		!strings.HasSuffix(s, ".") && !strings.Contains(s, "..")
}

// checkAllowedOrigin checks an allowed origin: "*", "null", or an origin as a
// browser sends it, scheme://host[:port] with nothing after it and the
// default port left out. Anything else would never match.
func checkAllowedOrigin(o string) error {
	if o == "*" || o == "null" {
		return nil
	}
	if o == "" {
		return errors.New("empty")
	}
	u, err := url.Parse(o)
	switch {
	case err != nil:
		return err
	case u.Scheme == "" || u.Host == "" || u.Opaque != "":
		return errors.New("want scheme://host[:port], as in https://app.example.com")
	case u.User != nil || u.Path != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(o, "#"):
		return errors.New("an origin is scheme://host[:port], with nothing after it (not even a /)")
	case strings.Contains(u.Host, "*"):
		return errors.New("no wildcards: list each origin, or * for any")
	case strings.EqualFold(u.Scheme, "https") && u.Port() == "443" || strings.EqualFold(u.Scheme, "http") && u.Port() == "80":
		return errors.New("browsers leave the default port out: drop it")
	}
	return nil
}
