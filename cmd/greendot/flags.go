package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/webhook"
)

// Flag categories, as --help groups them.
const (
	catNATS      = "NATS connection"
	catLog       = "Logging"
	catGateway   = "Gateway"
	catAuth      = "Authentication"
	catLimits    = "Limits"
	catTuning    = "Tuning"
	catEmbedded  = "Embedded NATS server"
	catProcess   = "Process"
	catOperation = "Health and metrics"
	catOutput    = "Output"
)

// envPrefix starts the environment variable of every flag.
const envPrefix = "GREENDOT_"

// envVar returns the environment variable of a flag: GREENDOT_ and the
// flag's name in upper snake case.
func envVar(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// ownEnv binds each of flags, which belong to one kind of process (or one
// command), to GREENDOT_, the kind and the flag's name: the reaper's
// --ack-wait is GREENDOT_REAPER_ACK_WAIT, the fanout's
// GREENDOT_FANOUT_ACK_WAIT. A variable set for one process then means
// nothing to another, and one environment can serve them all. The flags
// every process shares (NATS, logging, the gateway's) keep GREENDOT_ and
// their name.
func ownEnv(kind string, flags ...cli.Flag) []cli.Flag {
	for _, f := range flags {
		env := []string{envVar(kind + "-" + f.Names()[0])}
		switch f := f.(type) {
		case *cli.StringFlag:
			f.EnvVars = env
		case *cli.BoolFlag:
			f.EnvVars = env
		case *cli.IntFlag:
			f.EnvVars = env
		case *cli.Float64Flag:
			f.EnvVars = env
		case *cli.DurationFlag:
			f.EnvVars = env
		}
	}
	return flags
}

func stringFlag(cat, name, value, usage string) *cli.StringFlag {
	return &cli.StringFlag{Category: cat, Name: name, Value: value, Usage: usage, EnvVars: []string{envVar(name)}}
}

func boolFlag(cat, name, usage string) *cli.BoolFlag {
	return &cli.BoolFlag{Category: cat, Name: name, Usage: usage, EnvVars: []string{envVar(name)}}
}

func intFlag(cat, name string, value int, usage string) *cli.IntFlag {
	return &cli.IntFlag{Category: cat, Name: name, Value: value, Usage: usage, EnvVars: []string{envVar(name)}}
}

func floatFlag(cat, name string, value float64, usage string) *cli.Float64Flag {
	return &cli.Float64Flag{Category: cat, Name: name, Value: value, Usage: usage, EnvVars: []string{envVar(name)}}
}

func durationFlag(cat, name string, value time.Duration, usage string) *cli.DurationFlag {
	return &cli.DurationFlag{Category: cat, Name: name, Value: value, Usage: usage, EnvVars: []string{envVar(name)}}
}

// logFlags are on every command.
func logFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag(catLog, "log-level", "info", "least level logged: debug, info, warn or error"),
		stringFlag(catLog, "log-format", "text", "log line format: text (logfmt) or json"),
	}
}

// natsFlags say how a process connects to NATS.
func natsFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag(catNATS, "nats-url", natsconn.DefaultURL, "NATS server URLs, comma-separated"),
		stringFlag(catNATS, "nats-user", "", "NATS user name (with --nats-password)"),
		stringFlag(catNATS, "nats-password", "", "NATS password (with --nats-user)"),
		stringFlag(catNATS, "nats-token", "", "NATS authentication token"),
		stringFlag(catNATS, "nats-creds", "", "NATS credentials file (JWT and NKey seed)"),
		stringFlag(catNATS, "nats-nkey", "", "file holding a NATS NKey seed"),
		stringFlag(catNATS, "nats-ca", "", "PEM file of the CA that signed the NATS servers' certificates"),
		stringFlag(catNATS, "nats-cert", "", "PEM client certificate for mutual TLS with NATS (with --nats-key)"),
		stringFlag(catNATS, "nats-key", "", "PEM private key of --nats-cert"),
		intFlag(catNATS, "replicas", 1, "replicas of each bucket created: 1 on a single NATS server, 3 (or 5) in a cluster; give every process the same value"),
	}
}

// gatewayFlags configure a gateway. standalone changes the defaults that
// standalone mode has of its own.
func gatewayFlags(standalone bool) []cli.Flag {
	d := gateway.DefaultConfig()
	devAuth := boolFlag(catAuth, "dev-auth", "accept ?user=<id> as a client's identity with no proof: development only")
	if standalone {
		devAuth.Value = true
		devAuth.DefaultText = "true while --listen is a loopback address"
	}
	return []cli.Flag{
		stringFlag(catGateway, "listen", "127.0.0.1:8080", "address of the WebSocket endpoint (/ws) and the HTTP API"),
		&cli.StringFlag{Category: catGateway, Name: "gateway-id", Usage: "this gateway's id in connection records and subjects, 1 to 64 of A-Z a-z 0-9 _ -",
			DefaultText: "random", EnvVars: []string{envVar("gateway-id")}},
		stringFlag(catGateway, "policy", string(d.Policy), "who may watch whom: mutual (both follow each other), follow (the watcher follows the target), everyone (also enables global presence), token (the watch claim of the watcher's JWT lists the target) or app (the app, asked at --authz-app-url or --authz-app-subject, allows it)"),
		&cli.DurationFlag{Category: catGateway, Name: "heartbeat-interval", Value: d.HeartbeatInterval,
			Usage:       "how often clients are asked to send a heartbeat; less than --conn-ttl",
			DefaultText: d.HeartbeatInterval.String() + ", or half of --conn-ttl when that is shorter",
			EnvVars:     []string{envVar("heartbeat-interval")}},
		durationFlag(catGateway, "conn-ttl", d.ConnTTL, "how long a connection stays live without a frame from its client; at least 1s, rounded up to whole seconds"),
		&cli.DurationFlag{Category: catGateway, Name: "lease-ttl",
			Usage:       "how long the gateway's lease outlives its last refresh (about every second): when the gateway dies, or loses NATS for longer, its users go offline after this; at least 1s, at most --conn-ttl",
			DefaultText: "--conn-ttl", EnvVars: []string{envVar("lease-ttl")}},
		durationFlag(catGateway, "offline-grace", d.OfflineGrace, "how long a cleanly closed connection still counts, so a page reload does not flap; 0 for none; rounded up to whole seconds"),
		durationFlag(catGateway, "background-grace", d.BackgroundGrace, "the longest a connection whose app went to the background (a background message) still counts, away, once its socket closes or dies; a client may ask for less; at most 24h"),
		durationFlag(catGateway, "away-after", d.AwayAfter, "how long a connection may go without activity before it counts as idle"),
		durationFlag(catGateway, "batch-interval", d.BatchInterval, "least time between two frames of changes to one watching socket, changes that come sooner coalesced; 1ms to 10s"),
		&cli.DurationFlag{Category: catGateway, Name: "batch-pace",
			Usage:       "time between frames to a socket whose changes come continuously, coalesced (after a quiet spell a socket gets a few frames a batch interval apart first); at least --batch-interval, at most 10s",
			DefaultText: gateway.DefaultBatchPace.String() + ", or --batch-interval when that is longer",
			EnvVars:     []string{envVar("batch-pace")}},
		durationFlag(catGateway, "authz-cache-ttl", d.AuthzCacheTTL, "how long an authorization decision and a user's privacy settings are cached"),
		intFlag(catGateway, "token-watch-max", d.TokenMaxWatch, "user ids a token's watch claim may list (policy token); a token with more is refused with 401"),
		stringFlag(catGateway, "authz-app-url", "", "URL the app policy POSTs its signed questions to (needs an app secret); or use --authz-app-subject"),
		stringFlag(catGateway, "authz-app-subject", "", "NATS subject the app policy sends its questions to, request/reply; or use --authz-app-url"),
		stringFlag(catGateway, "authz-app-secret", "", "shared secret, at least 32 bytes, that signs questions to --authz-app-url and --connect-proxy-url and verifies POST /api/authz/invalidate (prefer --authz-app-secret-file or the environment variable)"),
		stringFlag(catGateway, "authz-app-secret-file", "", "file holding the app secret (trailing newlines are ignored)"),
		durationFlag(catGateway, "authz-app-timeout", d.AppTimeout, "how long one question to the app may take, retries included; no answer refuses with authorization_unavailable"),
		durationFlag(catGateway, "authz-app-cache-ttl", d.AppCacheTTL, "how long an answer of the app is cached per watcher and target; an invalidation drops it sooner"),
		durationFlag(catGateway, "drain-period", d.DrainPeriod, "on shutdown, how long to spread the closing of sockets (1001) over, so clients reconnect elsewhere gradually; 0 closes all at once"),
		stringFlag(catGateway, "tls-cert", "", "PEM file of the certificate (and its chain) to serve TLS with, wss:// and https:// on --listen, with no proxy in front; read again when it changes, so a renewal needs no restart (needs --tls-key)"),
		stringFlag(catGateway, "tls-key", "", "PEM file of the key of --tls-cert"),
		durationFlag(catGateway, "tls-reload", d.TLSReload, "how often --tls-cert and --tls-key are looked at for changes, at most (on the next TLS handshake)"),
		stringFlag(catGateway, "trusted-proxies", "", "comma-separated addresses or prefixes (10.0.0.0/8) of the load balancers and proxies in front of the gateway: a request from one is taken to come from the address its Forwarded or X-Forwarded-For header names, for per-address limits and logs; empty trusts none"),
		&cli.BoolFlag{Category: catGateway, Name: "ws-compression", Value: true, EnvVars: []string{envVar("ws-compression")},
			Usage: "accept permessage-deflate (RFC 7692) from clients that offer it (every browser), with no context takeover: frames of 512 bytes or more go compressed; --ws-compression=false declines it"},
		stringFlag(catGateway, "allowed-origins", "", "comma-separated Origin values a browser may connect from (https://app.example.com), or * for any; empty allows any"),

		devAuth,
		boolFlag(catAuth, "dev-auth-allow-public", "allow --dev-auth on an address that is not loopback: anyone who reaches it can claim any user id"),
		stringFlag(catAuth, "dev-auth-hosts", "", "comma-separated host names, besides localhost and IP addresses, that a gateway with dev auth answers for (the names this machine is reached by); a request naming another host is refused with 403, so that a web page whose name points to this machine cannot act as any user"),
		stringFlag(catAuth, "jwt-secret", "", "HMAC secret of HS256/HS384/HS512 tokens, at least 32 bytes (prefer --jwt-secret-file or the environment variable: command lines are visible to other users)"),
		stringFlag(catAuth, "jwt-secret-file", "", "file holding the HMAC secret (trailing newlines are ignored)"),
		stringFlag(catAuth, "jwt-public-key", "", "PEM file with the public key (or certificate) of RS256/ES256/EdDSA tokens"),
		stringFlag(catAuth, "jwt-keys", "", "JWK Set of the keys tokens are signed with, each token's kid naming its key: a file, or an http(s) URL (an identity provider's jwks_uri); read again every --jwt-keys-refresh and when a token names a kid it lacks (at most every 30s), so keys rotate without a restart"),
		durationFlag(catAuth, "jwt-keys-refresh", auth.DefaultKeyRefresh, "how often the --jwt-keys set is read again"),
		stringFlag(catAuth, "connect-proxy-url", "", "URL the gateway POSTs the question of who a client is whose upgrade carries no token, signed with the app secret (--authz-app-secret or --authz-app-secret-file): its cookies and --connect-proxy-headers are forwarded, and the app answers with a user id and an expiry, refreshed before it ends, or a refusal (401); or use --connect-proxy-subject"),
		stringFlag(catAuth, "connect-proxy-subject", "", "NATS subject the connect proxy's questions are sent to instead, request/reply; or use --connect-proxy-url"),
		stringFlag(catAuth, "connect-proxy-headers", "", "comma-separated names of the upgrade request's headers forwarded to the connect proxy besides Cookie (User-Agent, X-Forwarded-For)"),
		durationFlag(catAuth, "connect-proxy-timeout", d.ConnectProxyTimeout, "how long one question to the connect proxy may take, retries included; no good answer refuses the upgrade with 503; less than --handshake-timeout"),
		stringFlag(catAuth, "jwt-issuer", "", "iss claim every token must carry; empty checks none"),
		stringFlag(catAuth, "jwt-audience", "", "value the aud claim of every token must contain; empty checks none"),
		durationFlag(catAuth, "jwt-leeway", 0, "clock skew forgiven when checking exp, nbf and iat; at most 5m"),
		stringFlag(catAuth, "api-keys-file", "", "file of the keys a backend calls the server API (/api/server/) with, one per line: a name, its scopes (presence:read, status:write) and the key (at least 24 characters) or sha256:<its hex>; read again when it changes, so keys rotate without a restart; empty serves no server API"),
		durationFlag(catAuth, "api-keys-refresh", d.APIKeysRefresh, "how often --api-keys-file is looked at for changes"),

		intFlag(catLimits, "max-message-size", d.MaxMessageSize, "largest client message in bytes (256 to 1048576); larger frames close the socket with 1009"),
		intFlag(catLimits, "max-subscriptions", d.MaxSubscriptions, "subscriptions one socket may hold"),
		intFlag(catLimits, "max-subscribe-ids", d.MaxSubscribeIDs, "user ids in one subscribe message"),
		intFlag(catLimits, "max-query-ids", d.MaxQueryIDs, "user ids in one POST /api/presence/query"),
		intFlag(catLimits, "online-limit", d.OnlineLimit, "users listed by global presence (policy everyone)"),
		&cli.IntFlag{Category: catLimits, Name: "max-conns", Value: d.MaxConns, Usage: "connections this gateway holds (503 when full); 0 for no limit",
			DefaultText: "0 (no limit)", EnvVars: []string{envVar("max-conns")}},
		intFlag(catLimits, "room-meta-max", d.RoomMetaMax, "bytes of the meta (a JSON object) of one connection in a room"),
		intFlag(catLimits, "max-rooms-per-conn", d.MaxRoomsPerConn, "rooms one socket may be in at once; one more join is refused with too_many_rooms"),
		intFlag(catLimits, "room-members-max", d.RoomMembersMax, "users a room_state (and GET /api/rooms/{room}) lists; beyond it the state is truncated, with the true count"),
		floatFlag(catLimits, "room-update-rate", d.RoomUpdateRate, "room_update messages per second a socket may send on average; more are answered rate_limited"),
		intFlag(catLimits, "room-update-burst", d.RoomUpdateBurst, "room_update messages a socket may send at once"),
		floatFlag(catLimits, "signal-rate", d.SignalRate, "typing and signal messages per second a socket may send on average; more are answered rate_limited"),
		intFlag(catLimits, "signal-burst", d.SignalBurst, "typing and signal messages a socket may send at once"),
		intFlag(catLimits, "max-conns-per-user", d.MaxConnsPerUser, "connections one user may hold on this gateway"),
		intFlag(catLimits, "max-registering", d.MaxRegistering, "upgrades registered in NATS at once; more are refused with 503 at once, so a reconnect storm does not pile up work that times out"),
		floatFlag(catLimits, "rate-limit", d.RateLimit, "frames per second a socket may send on average, every frame counted: messages, their fragments, pings and pongs"),
		intFlag(catLimits, "rate-burst", d.RateBurst, "frames a socket may send at once"),
		intFlag(catLimits, "rate-strikes", d.RateStrikes, "rate_limited errors of --rate-limit a socket may earn within a minute before it is closed with 1008 (those of other limits do not count)"),
		floatFlag(catLimits, "api-rate-limit", d.APIRateLimit, "HTTP API requests per second one identity may make on average; more are answered 429 with Retry-After"),
		intFlag(catLimits, "api-rate-burst", d.APIRateBurst, "HTTP API requests one identity may make at once"),
		floatFlag(catLimits, "api-address-rate-limit", d.APIAddressRateLimit, "HTTP API requests per second one source address may make on average, checked before authentication (behind a proxy every client shares the proxy's address unless it is in --trusted-proxies)"),
		intFlag(catLimits, "api-address-rate-burst", d.APIAddressRateBurst, "HTTP API requests one source address may make at once"),
		floatFlag(catLimits, "api-key-rate-limit", d.APIKeyRateLimit, "server API requests per second one API key may make on average, apart from users' limits"),
		intFlag(catLimits, "api-key-rate-burst", d.APIKeyRateBurst, "server API requests one API key may make at once"),
		durationFlag(catLimits, "handshake-timeout", d.HandshakeTimeout, "time from accepting a TCP connection to the end of its WebSocket handshake or of its first HTTP request (head and body); as long for each later request from its first bytes, and for an idle kept-alive connection"),
		durationFlag(catLimits, "write-timeout", d.WriteTimeout, "time a socket may take nothing of the frames waiting for it (at most 1 MiB); a slower socket is closed"),

		intFlag(catTuning, "read-workers", d.ReadWorkers, "sockets read at once"),
		intFlag(catTuning, "write-workers", d.WriteWorkers, "sockets written to at once by the batch flusher"),
		intFlag(catTuning, "kv-max-pending", d.KVMaxPending, "asynchronous connection key writes in flight"),
		durationFlag(catTuning, "memory-trim-interval", d.MemoryTrimInterval, "how often to look whether the process is quiet and holds free memory worth giving back to the system (collected, then returned); 0 never"),
	}
}

// reaperFlags configure a reaper. They are the reaper's own.
func reaperFlags() []cli.Flag {
	d := reaper.DefaultConfig()
	return ownEnv("reaper",
		intFlag(catProcess, "workers", d.Workers, "users reconciled at once"),
		sweepFlag(),
		durationFlag(catProcess, "ack-wait", d.AckWait, "how long the end of a gateway's lease may stay unacknowledged before it is handed to another reaper"),
		durationFlag(catProcess, "rejoin-hold", d.RejoinHold, "how long after the reaper's NATS connection comes back the ends of leases wait, so that gateways that lost NATS too register their connections again first; 0 for none"),
		metricsFlag(),
	)
}

// sweepFlag is the reaper's --sweep-interval, for every command that runs
// a reaper.
func sweepFlag() cli.Flag {
	f := durationFlag(catProcess, "sweep-interval", reaper.DefaultConfig().SweepInterval,
		"how often the reaper's full sweep of statuses, leases and connections runs after the one at start; 0 for never (it only repairs what was changed by hand, and reads every record and key each time); else at least 100ms")
	f.DefaultText = "0 (never)"
	return ownEnv("reaper", f)[0]
}

// fanoutFlags configure a fanout. They are the fanout's own.
func fanoutFlags() []cli.Flag {
	d := fanout.DefaultConfig()
	return ownEnv("fanout",
		intFlag(catProcess, "cache-size", d.CacheSize, "users whose last published versions are remembered to suppress duplicate events"),
		durationFlag(catProcess, "ack-wait", d.AckWait, "how long a status revision may stay unacknowledged before it is handed to another fanout; more than --delay"),
		durationFlag(catProcess, "delay", d.Delay, "how long after a status revision was written the fanout waits for its writer to publish its events before it publishes them itself; at most 1m"),
		metricsFlag(),
	)
}

// webhooksFlags configure greendot webhooks. They are its own.
func webhooksFlags() []cli.Flag {
	return ownEnv("webhooks", append(webhookFlags("", catProcess), metricsFlag())...)
}

// metricsFlag serves health and metrics for processes without a listener
// of their own.
func metricsFlag() cli.Flag {
	return stringFlag(catOperation, "metrics-listen", "", "address of an HTTP server with GET /healthz, /readyz and /metrics; empty for none")
}

// concat joins flag lists.
func concat(lists ...[]cli.Flag) []cli.Flag {
	var out []cli.Flag
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// splitList splits a comma-separated flag value, trimming spaces.
func splitList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

// quote quotes a flag value for an error message.
func quote(s string) string { return strconv.Quote(s) }

// catWebhooks groups the webhooks flags of standalone mode.
const catWebhooks = "Webhooks"

// webhookFlags configure a webhooks process. Their names start with
// prefix: none for greendot webhooks, "webhook-" in standalone mode, where
// they sit beside the gateway's.
func webhookFlags(prefix, cat string) []cli.Flag {
	d := webhook.DefaultConfig()
	name := func(n string) string { return prefix + n }
	urlUsage := "endpoint every batch of events is POSTed to: http:// or https://"
	if prefix != "" {
		urlUsage += "; empty runs no webhooks process"
	}
	return []cli.Flag{
		stringFlag(cat, name("url"), "", urlUsage),
		stringFlag(cat, name("secret"), "", "key of every delivery's HMAC-SHA256 signature, at least 16 bytes (prefer --"+name("secret-file")+" or the environment variable: command lines are visible to other users)"),
		stringFlag(cat, name("secret-file"), "", "file holding the signature key (trailing newlines are ignored)"),
		stringFlag(cat, name("previous-secret"), "", "while the secret is rotated, the one being rotated out: every delivery is signed with both (two v1), so a receiver may move to the new one at its own pace"),
		stringFlag(cat, name("previous-secret-file"), "", "file holding the previous signature key"),
		stringFlag(cat, name("consumer"), d.Consumer, "durable consumer on the status stream that every process serving this endpoint shares; one per endpoint"),
		stringFlag(cat, name("invisible"), string(d.Invisible), "what is sent of an invisible user: true (invisible, with devices: the app's backend knows) or public (offline, as watchers see it)"),
		stringFlag(cat, name("users"), "", "comma-separated users whose events are sent, each a user id or a pattern (team_*, *_bot, user[0-9]); empty sends every user's"),
		stringFlag(cat, name("events"), "", "comma-separated kinds of change an event is sent for: status, devices, last_seen, custom_status; empty sends every change"),
		intFlag(cat, name("batch-size"), d.BatchSize, "most events in one POST, and most revisions handed out unacknowledged; 1 to 10000"),
		durationFlag(cat, name("batch-wait"), d.BatchWait, "how long a batch waits for more events after its first; at most 1m"),
		durationFlag(cat, name("timeout"), d.Timeout, "time one POST may take, from connecting to reading the response"),
		durationFlag(cat, name("min-backoff"), d.MinBackoff, "wait after a first failed attempt; it doubles with each further one (a 429 or 503's Retry-After replaces it)"),
		durationFlag(cat, name("max-backoff"), d.MaxBackoff, "longest wait between attempts"),
		durationFlag(cat, name("give-up-after"), d.GiveUpAfter, "how long a batch that keeps failing is retried before it is dead-lettered, and how long after that its users' current state is tried"),
		floatFlag(cat, name("rate-limit"), d.RateLimit, "most POSTs a second to the endpoint, retries included"),
		durationFlag(cat, name("ack-wait"), d.AckWait, "how long a revision may stay unacknowledged by a process that stopped working on it before it is handed out again; at least 3s"),
		durationFlag(cat, name("pinned-ttl"), d.PinnedTTL, "one process serves the endpoint at a time: how long after it stops pulling another takes over; at least 3s"),
	}
}
