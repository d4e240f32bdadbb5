package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/auth"
	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/webhook"
)

// newLogger builds the one slog handler of the process from --log-level and
// --log-format, writing to the app's error stream.
func newLogger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	switch v := c.String("log-level"); v {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		return nil, fmt.Errorf("--log-level %s: want debug, info, warn or error", quote(v))
	}
	opts := &slog.HandlerOptions{Level: level}
	switch v := c.String("log-format"); v {
	case "text":
		return slog.New(slog.NewTextHandler(c.App.ErrWriter, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(c.App.ErrWriter, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %s: want text or json", quote(v))
	}
}

// natsOptions reads the NATS connection flags.
func natsOptions(c *cli.Context, name string, log *slog.Logger) natsconn.Options {
	return natsconn.Options{
		URL:       c.String("nats-url"),
		Name:      name,
		User:      c.String("nats-user"),
		Password:  c.String("nats-password"),
		Token:     c.String("nats-token"),
		CredsFile: c.String("nats-creds"),
		NKeyFile:  c.String("nats-nkey"),
		CAFile:    c.String("nats-ca"),
		CertFile:  c.String("nats-cert"),
		KeyFile:   c.String("nats-key"),
		Logger:    log,
	}
}

// bucketOptions reads --replicas.
func bucketOptions(c *cli.Context) (presence.BucketOptions, error) {
	n := c.Int("replicas")
	if n < 1 || n > 5 {
		return presence.BucketOptions{}, fmt.Errorf("--replicas %d: want 1 to 5", n)
	}
	return presence.BucketOptions{Replicas: n}, nil
}

// flagGiven reports whether flag name was given a value, on the command line
// or in the environment: for a text flag, one that is not empty, since an
// empty one is what the flag holds when it is not given.
func flagGiven(c *cli.Context, name string) bool {
	if !c.IsSet(name) {
		return false
	}
	for _, f := range c.Command.Flags {
		if _, ok := f.(*cli.StringFlag); ok && slices.Contains(f.Names(), name) {
			return c.String(name) != ""
		}
	}
	return true
}

// positive checks that duration flags are above zero.
func positive(c *cli.Context, names ...string) error {
	for _, name := range names {
		if d := c.Duration(name); d <= 0 {
			return fmt.Errorf("--%s %v: want a positive duration", name, d)
		}
	}
	return nil
}

// notNegative checks that duration flags are zero or more.
func notNegative(c *cli.Context, names ...string) error {
	for _, name := range names {
		if d := c.Duration(name); d < 0 {
			return fmt.Errorf("--%s %v: want 0 or a positive duration", name, d)
		}
	}
	return nil
}

// atLeast checks that integer flags are at least min.
func atLeast(c *cli.Context, min int, names ...string) error {
	for _, name := range names {
		if n := c.Int(name); n < min {
			return fmt.Errorf("--%s %d: want at least %d", name, n, min)
		}
	}
	return nil
}

// positiveRates checks that rate flags are above zero (NaN is not), in
// unit ("messages", "requests") per second.
func positiveRates(c *cli.Context, unit string, names ...string) error {
	for _, name := range names {
		if r := c.Float64(name); !(r > 0) {
			return fmt.Errorf("--%s %v: want a positive number of %s per second", name, r, unit)
		}
	}
	return nil
}

// gatewayConfig reads the gateway flags into a validated gateway.Config.
// DevAuth is left to gatewayAuth, which needs to know the listen address.
func gatewayConfig(c *cli.Context, log *slog.Logger, buckets presence.BucketOptions) (gateway.Config, error) {
	var cfg gateway.Config
	policy, err := gateway.ParsePolicy(c.String("policy"))
	if err != nil {
		return cfg, fmt.Errorf("--policy %s: want mutual, follow, everyone, token or app", quote(c.String("policy")))
	}
	if err := positive(c, "conn-ttl", "away-after", "batch-interval", "authz-cache-ttl", "handshake-timeout", "write-timeout"); err != nil {
		return cfg, err
	}
	if c.IsSet("heartbeat-interval") {
		if err := positive(c, "heartbeat-interval"); err != nil {
			return cfg, err
		}
		cfg.HeartbeatInterval = c.Duration("heartbeat-interval")
	}
	if err := notNegative(c, "offline-grace", "drain-period", "jwt-leeway", "memory-trim-interval"); err != nil {
		return cfg, err
	}
	if err := positive(c, "api-keys-refresh", "tls-reload"); err != nil {
		return cfg, err
	}
	if err := atLeast(c, 1, "max-message-size", "max-subscriptions", "max-subscribe-ids", "max-query-ids", "online-limit",
		"max-conns-per-user", "max-registering", "room-meta-max", "max-rooms-per-conn", "room-members-max", "room-update-burst", "signal-burst", "rate-burst", "rate-strikes", "api-rate-burst", "api-address-rate-burst", "api-key-rate-burst", "read-workers", "write-workers", "kv-max-pending"); err != nil {
		return cfg, err
	}
	if err := atLeast(c, 0, "max-conns"); err != nil {
		return cfg, err
	}
	if err := positiveRates(c, "messages", "rate-limit", "room-update-rate", "signal-rate"); err != nil {
		return cfg, err
	}
	if err := positiveRates(c, "requests", "api-rate-limit", "api-address-rate-limit", "api-key-rate-limit"); err != nil {
		return cfg, err
	}
	origins := splitList(c.String("allowed-origins"))
	for _, o := range origins {
		if o == "" {
			return cfg, fmt.Errorf("--allowed-origins %s: empty entry", quote(c.String("allowed-origins")))
		}
	}
	var trusted []netip.Prefix
	for _, s := range splitList(c.String("trusted-proxies")) {
		p, err := parsePrefix(s)
		if err != nil {
			return cfg, fmt.Errorf("--trusted-proxies %s: %v", quote(c.String("trusted-proxies")), err)
		}
		trusted = append(trusted, p)
	}
	cfg.TrustedProxies = trusted
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSReload = c.String("tls-cert"), c.String("tls-key"), c.Duration("tls-reload")
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return cfg, errors.New("--tls-cert and --tls-key go together")
	}
	if cfg.TLSCertFile != "" {
		if _, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
			return cfg, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", quote(cfg.TLSCertFile), quote(cfg.TLSKeyFile), err)
		}
	}
	devHosts := splitList(c.String("dev-auth-hosts"))
	for _, h := range devHosts {
		if h == "" {
			return cfg, fmt.Errorf("--dev-auth-hosts %s: empty entry", quote(c.String("dev-auth-hosts")))
		}
	}
	grace := c.Duration("offline-grace")
	if grace == 0 {
		grace = gateway.NoOfflineGrace
	}

	cfg.Logger = log
	cfg.Buckets = buckets
	cfg.ID = c.String("gateway-id")
	cfg.ConnTTL = c.Duration("conn-ttl")
	if c.IsSet("lease-ttl") {
		if err := positive(c, "lease-ttl"); err != nil {
			return cfg, err
		}
		cfg.LeaseTTL = c.Duration("lease-ttl")
	}
	cfg.OfflineGrace = grace
	if err := positive(c, "background-grace"); err != nil {
		return cfg, err
	}
	cfg.BackgroundGrace = c.Duration("background-grace")
	cfg.AwayAfter = c.Duration("away-after")
	cfg.BatchInterval = c.Duration("batch-interval")
	if c.IsSet("batch-pace") {
		if err := positive(c, "batch-pace"); err != nil {
			return cfg, err
		}
		cfg.BatchPace = c.Duration("batch-pace")
	}
	cfg.AllowedOrigins = origins
	cfg.DevAuthHosts = devHosts
	cfg.Policy = policy
	cfg.AuthzCacheTTL = c.Duration("authz-cache-ttl")
	cfg.NoCompression = !c.Bool("ws-compression")
	cfg.MaxMessageSize = c.Int("max-message-size")
	cfg.MaxSubscriptions = c.Int("max-subscriptions")
	cfg.MaxSubscribeIDs = c.Int("max-subscribe-ids")
	cfg.MaxQueryIDs = c.Int("max-query-ids")
	cfg.OnlineLimit = c.Int("online-limit")
	cfg.MaxConns = c.Int("max-conns")
	cfg.MaxConnsPerUser = c.Int("max-conns-per-user")
	cfg.RoomMetaMax = c.Int("room-meta-max")
	cfg.MaxRoomsPerConn = c.Int("max-rooms-per-conn")
	cfg.RoomMembersMax = c.Int("room-members-max")
	cfg.RoomUpdateRate = c.Float64("room-update-rate")
	cfg.RoomUpdateBurst = c.Int("room-update-burst")
	cfg.SignalRate = c.Float64("signal-rate")
	cfg.SignalBurst = c.Int("signal-burst")
	cfg.MaxRegistering = c.Int("max-registering")
	cfg.RateLimit = c.Float64("rate-limit")
	cfg.RateBurst = c.Int("rate-burst")
	cfg.RateStrikes = c.Int("rate-strikes")
	cfg.APIRateLimit = c.Float64("api-rate-limit")
	cfg.APIRateBurst = c.Int("api-rate-burst")
	cfg.APIAddressRateLimit = c.Float64("api-address-rate-limit")
	cfg.APIAddressRateBurst = c.Int("api-address-rate-burst")
	cfg.APIKeysFile = c.String("api-keys-file")
	if cfg.APIKeysFile != "" {
		if err := gateway.CheckAPIKeysFile(cfg.APIKeysFile); err != nil {
			return cfg, fmt.Errorf("--api-keys-file: %w", err)
		}
	}
	cfg.APIKeysRefresh = c.Duration("api-keys-refresh")
	cfg.APIKeyRateLimit = c.Float64("api-key-rate-limit")
	cfg.APIKeyRateBurst = c.Int("api-key-rate-burst")
	cfg.HandshakeTimeout = c.Duration("handshake-timeout")
	cfg.WriteTimeout = c.Duration("write-timeout")
	cfg.ReadWorkers = c.Int("read-workers")
	cfg.WriteWorkers = c.Int("write-workers")
	cfg.KVMaxPending = c.Int("kv-max-pending")
	cfg.MemoryTrimInterval = c.Duration("memory-trim-interval")
	cfg.DrainPeriod = c.Duration("drain-period")

	v, err := tokenVerifier(c, log)
	if err != nil {
		return cfg, err
	}
	if v != nil {
		cfg.Tokens = v
	}
	if err := appAuthz(c, &cfg); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// tokenVerifier reads the JWT flags. It returns nil when no key is given.
func tokenVerifier(c *cli.Context, log *slog.Logger) (*auth.Verifier, error) {
	secret, secretFile, publicKey, keys := c.String("jwt-secret"), c.String("jwt-secret-file"), c.String("jwt-public-key"), c.String("jwt-keys")
	given := 0
	for _, v := range []string{secret, secretFile, publicKey, keys} {
		if v != "" {
			given++
		}
	}
	if given > 1 {
		return nil, errors.New("give only one of --jwt-secret, --jwt-secret-file, --jwt-public-key and --jwt-keys")
	}
	if keys == "" && flagGiven(c, "jwt-keys-refresh") {
		return nil, errors.New("--jwt-keys-refresh needs --jwt-keys")
	}
	if given == 0 {
		for _, name := range []string{"jwt-issuer", "jwt-audience", "jwt-leeway"} {
			if flagGiven(c, name) {
				return nil, fmt.Errorf("--%s needs a JWT key: give --jwt-secret, --jwt-secret-file, --jwt-public-key or --jwt-keys", name)
			}
		}
		return nil, nil
	}
	cfg := auth.Config{
		Issuer:   c.String("jwt-issuer"),
		Audience: c.String("jwt-audience"),
		Leeway:   c.Duration("jwt-leeway"),
	}
	flag := "--jwt-secret"
	switch {
	case secret != "":
		cfg.Secret = []byte(secret)
	case keys != "":
		flag = "--jwt-keys"
		if err := positive(c, "jwt-keys-refresh"); err != nil {
			return nil, err
		}
		if strings.HasPrefix(keys, "http://") {
			log.Warn("--jwt-keys is read over plain http: anyone on the network path could swap the keys; use https outside a trusted network", "url", keys)
		}
		ks, err := auth.NewKeySet(c.Context, auth.KeySetConfig{Source: keys, Refresh: c.Duration("jwt-keys-refresh"), Logger: log})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		cfg.Keys = ks
	case secretFile != "":
		flag = "--jwt-secret-file"
		data, err := os.ReadFile(secretFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		if cfg.Secret = bytes.TrimRight(data, "\r\n"); len(cfg.Secret) == 0 {
			return nil, fmt.Errorf("%s %s: the file is empty", flag, secretFile)
		}
	default:
		flag = "--jwt-public-key"
		data, err := os.ReadFile(publicKey)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		cfg.PublicKey = data
	}
	v, err := auth.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return v, nil
}

// gatewayAuth decides whether dev auth is on and refuses a gateway that
// would admit nobody, or anybody from outside this machine. In standalone
// mode dev auth is on by default while the listen address is loopback.
func gatewayAuth(c *cli.Context, cfg *gateway.Config, log *slog.Logger, standalone bool) error {
	listen := c.String("listen")
	loopback, err := isLoopback(listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", quote(listen), err)
	}
	devAuth := c.Bool("dev-auth")
	if standalone && devAuth && !loopback && !c.IsSet("dev-auth") {
		devAuth = false
		log.Info("dev auth is off: --listen is not a loopback address", "addr", listen)
	}
	proxied := cfg.ConnectProxyURL != "" || cfg.ConnectProxySubject != ""
	if standalone && devAuth && proxied && !c.IsSet("dev-auth") {
		devAuth = false
		log.Info("dev auth is off: the connect proxy says who a client without a token is")
	}
	if devAuth && proxied {
		return errors.New("--dev-auth and a connect proxy both admit clients that send no token: choose one")
	}
	if devAuth && !loopback && !c.Bool("dev-auth-allow-public") {
		return fmt.Errorf("--dev-auth on %s, which is not a loopback address, would let anyone who reaches it claim any user id: "+
			"use a JWT key, or add --dev-auth-allow-public to do it anyway", listen)
	}
	if !devAuth && cfg.Tokens == nil && !proxied {
		how := "give --jwt-secret, --jwt-secret-file, --jwt-public-key or --jwt-keys, or a connect proxy (--connect-proxy-url or --connect-proxy-subject) (or --dev-auth, for development only)"
		if standalone && !loopback {
			how = "dev auth is off because --listen is not a loopback address; " + how
		}
		return fmt.Errorf("the gateway has neither dev auth nor a JWT key, so it would admit nobody: %s", how)
	}
	cfg.DevAuth = devAuth
	if devAuth {
		log.Warn("DEV AUTH IS ON: any client can connect as any user with ?user=<id>; never run it like this in production",
			"addr", listen, "loopback_only", loopback)
	}
	if v, ok := cfg.Tokens.(*auth.Verifier); ok {
		log.Info("jwt auth on", "key", v.KeyKind(), "source", c.String("jwt-keys"), "algorithms", strings.Join(v.Algorithms(), ","),
			"issuer", c.String("jwt-issuer"), "audience", c.String("jwt-audience"))
	}
	return nil
}

// isLoopback reports whether every address a listen address binds is a
// loopback address. An empty host binds every interface.
func isLoopback(hostport string) (bool, error) {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false, err
	}
	switch host {
	case "":
		return false, nil
	case "localhost":
		return true, nil
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback(), nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return false, err
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return false, nil
		}
	}
	return len(ips) > 0, nil
}

// reaperConfig reads the reaper flags into a validated reaper.Config.
func reaperConfig(c *cli.Context, log *slog.Logger, buckets presence.BucketOptions) (reaper.Config, error) {
	if err := positive(c, "ack-wait"); err != nil {
		return reaper.Config{}, err
	}
	if err := notNegative(c, "sweep-interval", "rejoin-hold"); err != nil {
		return reaper.Config{}, err
	}
	if err := atLeast(c, 1, "workers"); err != nil {
		return reaper.Config{}, err
	}
	hold := c.Duration("rejoin-hold")
	if hold == 0 {
		hold = reaper.NoRejoinHold
	}
	cfg := reaper.Config{
		Logger:        log,
		Buckets:       buckets,
		Workers:       c.Int("workers"),
		SweepInterval: c.Duration("sweep-interval"),
		AckWait:       c.Duration("ack-wait"),
		RejoinHold:    hold,
	}
	return cfg, cfg.Validate()
}

// fanoutConfig reads the fanout flags into a validated fanout.Config.
func fanoutConfig(c *cli.Context, log *slog.Logger, buckets presence.BucketOptions) (fanout.Config, error) {
	if err := positive(c, "ack-wait", "delay"); err != nil {
		return fanout.Config{}, err
	}
	if err := atLeast(c, 1, "cache-size"); err != nil {
		return fanout.Config{}, err
	}
	cfg := fanout.Config{
		Logger:    log,
		Buckets:   buckets,
		CacheSize: c.Int("cache-size"),
		AckWait:   c.Duration("ack-wait"),
		Delay:     c.Duration("delay"),
	}
	return cfg, cfg.Validate()
}

// appAuthz reads the flags of the token and app policies into cfg, and
// refuses those that do not fit the policy.
func appAuthz(c *cli.Context, cfg *gateway.Config) error {
	if err := positive(c, "authz-app-timeout", "authz-app-cache-ttl"); err != nil {
		return err
	}
	if err := atLeast(c, 1, "token-watch-max"); err != nil {
		return err
	}
	url, subject := c.String("authz-app-url"), c.String("authz-app-subject")
	secret, secretFile := c.String("authz-app-secret"), c.String("authz-app-secret-file")
	switch {
	case secret != "" && secretFile != "":
		return errors.New("give only one of --authz-app-secret and --authz-app-secret-file")
	case cfg.Policy != gateway.PolicyApp:
		for _, name := range []string{"authz-app-url", "authz-app-subject", "authz-app-secret", "authz-app-secret-file", "authz-app-timeout", "authz-app-cache-ttl"} {
			if strings.HasPrefix(name, "authz-app-secret") && c.String("connect-proxy-url") != "" {
				continue // it signs the connect proxy's questions
			}
			if flagGiven(c, name) {
				return fmt.Errorf("--%s is for --policy app, not %s", name, cfg.Policy)
			}
		}
	case url == "" && subject == "":
		return errors.New("--policy app needs --authz-app-url (the app answers HTTP) or --authz-app-subject (the app answers on NATS)")
	case url != "" && subject != "":
		return errors.New("give only one of --authz-app-url and --authz-app-subject")
	case url != "" && secret == "" && secretFile == "":
		return errors.New("--authz-app-url needs --authz-app-secret or --authz-app-secret-file: the questions are signed")
	}
	if cfg.Policy != gateway.PolicyToken && c.IsSet("token-watch-max") {
		return fmt.Errorf("--token-watch-max is for --policy token, not %s", cfg.Policy)
	}
	if err := connectProxy(c, cfg, secret != "" || secretFile != ""); err != nil {
		return err
	}
	if cfg.Policy == gateway.PolicyToken && cfg.Tokens == nil && cfg.ConnectProxyURL == "" && cfg.ConnectProxySubject == "" {
		return errors.New("--policy token reads the watch claim of JWTs (or of a connect proxy's answers): give --jwt-secret, --jwt-secret-file or --jwt-public-key, or a connect proxy")
	}
	flag := "--authz-app-secret"
	if secretFile != "" {
		flag = "--authz-app-secret-file"
		data, err := os.ReadFile(secretFile)
		if err != nil {
			return fmt.Errorf("%s: %w", flag, err)
		}
		if secret = string(bytes.TrimRight(data, "\r\n")); secret == "" {
			return fmt.Errorf("%s %s: the file is empty", flag, secretFile)
		}
	}
	if secret != "" && len(secret) < gateway.MinAppSecretLen {
		return fmt.Errorf("%s: %d bytes, want at least %d", flag, len(secret), gateway.MinAppSecretLen)
	}
	cfg.TokenMaxWatch = c.Int("token-watch-max")
	cfg.AppURL, cfg.AppSubject = url, subject
	if secret != "" {
		cfg.AppSecret = []byte(secret)
	}
	cfg.AppTimeout = c.Duration("authz-app-timeout")
	cfg.AppCacheTTL = c.Duration("authz-app-cache-ttl")
	return nil
}

// connectProxy reads the connect proxy's flags into cfg; secret says an
// app secret is given.
func connectProxy(c *cli.Context, cfg *gateway.Config, secret bool) error {
	url, subject := c.String("connect-proxy-url"), c.String("connect-proxy-subject")
	cfg.ConnectProxyTimeout = c.Duration("connect-proxy-timeout")
	switch {
	case url == "" && subject == "":
		for _, name := range []string{"connect-proxy-headers", "connect-proxy-timeout"} {
			if flagGiven(c, name) {
				return fmt.Errorf("--%s needs --connect-proxy-url or --connect-proxy-subject", name)
			}
		}
		return nil
	case url != "" && subject != "":
		return errors.New("give only one of --connect-proxy-url and --connect-proxy-subject")
	case url != "" && !secret:
		return errors.New("--connect-proxy-url needs --authz-app-secret or --authz-app-secret-file: the questions are signed")
	}
	if err := positive(c, "connect-proxy-timeout"); err != nil {
		return err
	}
	headers := splitList(c.String("connect-proxy-headers"))
	for _, h := range headers {
		if h == "" {
			return fmt.Errorf("--connect-proxy-headers %s: empty entry", quote(c.String("connect-proxy-headers")))
		}
	}
	cfg.ConnectProxyURL, cfg.ConnectProxySubject = url, subject
	cfg.ConnectProxyHeaders = headers
	return nil
}

// standaloneWebhookURL is standalone mode's flag that turns its webhooks
// process on.
const standaloneWebhookURL = "webhook-url"

// webhookConfig reads the webhook flags, whose names start with prefix,
// into a validated webhook.Config.
func webhookConfig(c *cli.Context, prefix string, log *slog.Logger, buckets presence.BucketOptions) (webhook.Config, error) {
	flag := func(n string) string { return prefix + n }
	var cfg webhook.Config
	if c.String(flag("url")) == "" {
		return cfg, fmt.Errorf("--%s: want the endpoint's URL", flag("url"))
	}
	invisible, err := webhook.ParseInvisible(c.String(flag("invisible")))
	if err != nil {
		return cfg, fmt.Errorf("--%s %s: want true or public", flag("invisible"), quote(c.String(flag("invisible"))))
	}
	users := splitList(c.String(flag("users")))
	for _, u := range users {
		if err := webhook.CheckUserPattern(u); err != nil {
			return cfg, fmt.Errorf("--%s %s: %v", flag("users"), quote(c.String(flag("users"))), err)
		}
	}
	var events []webhook.EventType
	for _, e := range splitList(c.String(flag("events"))) {
		t, err := webhook.ParseEventType(e)
		if err != nil {
			return cfg, fmt.Errorf("--%s %s: %v", flag("events"), quote(c.String(flag("events"))), err)
		}
		events = append(events, t)
	}
	if err := positive(c, flag("timeout"), flag("min-backoff"), flag("max-backoff"), flag("give-up-after"), flag("ack-wait"), flag("pinned-ttl")); err != nil {
		return cfg, err
	}
	if err := notNegative(c, flag("batch-wait")); err != nil {
		return cfg, err
	}
	if err := atLeast(c, 1, flag("batch-size")); err != nil {
		return cfg, err
	}
	if err := positiveRates(c, "requests", flag("rate-limit")); err != nil {
		return cfg, err
	}
	secret, err := webhookSecret(c, flag("secret"), flag("secret-file"))
	if err != nil {
		return cfg, err
	}
	var previous []byte
	if c.String(flag("previous-secret")) != "" || c.String(flag("previous-secret-file")) != "" {
		if previous, err = webhookSecret(c, flag("previous-secret"), flag("previous-secret-file")); err != nil {
			return cfg, err
		}
	}
	cfg = webhook.Config{
		Logger:         log,
		Buckets:        buckets,
		URL:            c.String(flag("url")),
		Secret:         secret,
		PreviousSecret: previous,
		Consumer:       c.String(flag("consumer")),
		Invisible:      invisible,
		Users:          users,
		Events:         events,
		BatchSize:      c.Int(flag("batch-size")),
		BatchWait:      c.Duration(flag("batch-wait")),
		Timeout:        c.Duration(flag("timeout")),
		MinBackoff:     c.Duration(flag("min-backoff")),
		MaxBackoff:     c.Duration(flag("max-backoff")),
		GiveUpAfter:    c.Duration(flag("give-up-after")),
		RateLimit:      c.Float64(flag("rate-limit")),
		AckWait:        c.Duration(flag("ack-wait")),
		PinnedTTL:      c.Duration(flag("pinned-ttl")),
	}
	if cfg.BatchWait == 0 {
		// Zero would stand for the default: a batch that waits for
		// nothing waits a nanosecond.
		cfg.BatchWait = time.Nanosecond
	}
	return cfg, cfg.Validate()
}

// webhookSecret reads the signature key from one of its two flags.
func webhookSecret(c *cli.Context, secretFlag, fileFlag string) ([]byte, error) {
	secret, file := c.String(secretFlag), c.String(fileFlag)
	switch {
	case secret != "" && file != "":
		return nil, fmt.Errorf("give only one of --%s and --%s", secretFlag, fileFlag)
	case secret != "":
		return []byte(secret), nil
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", fileFlag, err)
		}
		if data = bytes.TrimRight(data, "\r\n"); len(data) == 0 {
			return nil, fmt.Errorf("--%s %s: the file is empty", fileFlag, file)
		}
		return data, nil
	}
	return nil, fmt.Errorf("the deliveries must be signed: give --%s or --%s", fileFlag, secretFlag)
}

// standaloneWebhooks reads standalone mode's webhook flags. It returns nil
// when --webhook-url is not given, and refuses another webhook flag
// without it.
func standaloneWebhooks(c *cli.Context, log *slog.Logger) (*webhook.Config, error) {
	if c.String(standaloneWebhookURL) == "" {
		for _, f := range webhookFlags("webhook-", catWebhooks) {
			if n := f.Names()[0]; flagGiven(c, n) && n != standaloneWebhookURL {
				return nil, fmt.Errorf("--%s needs --%s", n, standaloneWebhookURL)
			}
		}
		return nil, nil
	}
	cfg, err := webhookConfig(c, "webhook-", log, presence.BucketOptions{})
	if err != nil {
		return nil, err
	}
	return &cfg, nil
}

// parsePrefix parses an address prefix (10.0.0.0/8, fd00::/8) or one
// address (192.0.2.7: the prefix of it alone).
func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q: want an address (192.0.2.7) or a prefix (10.0.0.0/8)", s)
	}
	ip = ip.Unmap()
	return netip.PrefixFrom(ip, ip.BitLen()), nil
}
