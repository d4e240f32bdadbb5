package main

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/fanout"
	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/reaper"
	"github.com/greendot/greendot/webhook"
)

// TestBadInput runs command lines that must be refused before anything
// starts: exit code 1 and one clear line on stderr.
func TestBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	emptySecret := filepath.Join(dir, "empty-secret")
	if err := os.WriteFile(emptySecret, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "key.txt")
	if err := os.WriteFile(notPEM, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	deadNATS := "nats://" + freeAddr(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Close() }()
	heldAddr := held.Addr().String()

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", []string{"gateway", "--frobnicate"}, "flag provided but not defined: --frobnicate"},
		{"unknown flag, one dash", []string{"gateway", "-frobnicate"}, "flag provided but not defined: --frobnicate"},
		{"flag without its value", []string{"gateway", "--dev-auth", "--conn-ttl"}, "flag needs an argument: --conn-ttl"},
		{"stray argument", []string{"gateway", "--dev-auth", "extra"}, `unexpected argument "extra"`},
		{"unknown policy", []string{"gateway", "--dev-auth", "--policy", "friends"}, `--policy "friends": want mutual, follow, everyone, token or app`},
		{"app policy with nothing to ask", []string{"gateway", "--dev-auth", "--policy", "app"}, "--policy app needs --authz-app-url (the app answers HTTP) or --authz-app-subject"},
		{"app policy asking twice", []string{"gateway", "--dev-auth", "--policy", "app", "--authz-app-url", "http://app.example/authz", "--authz-app-subject", "app.authz"}, "give only one of --authz-app-url and --authz-app-subject"},
		{"app URL without secret", []string{"gateway", "--dev-auth", "--policy", "app", "--authz-app-url", "http://app.example/authz"}, "--authz-app-url needs --authz-app-secret or --authz-app-secret-file"},
		{"app URL not HTTP", []string{"gateway", "--dev-auth", "--policy", "app", "--authz-app-url", "ftp://app.example", "--authz-app-secret", strings.Repeat("s", 32)}, `app URL "ftp://app.example": want an http:// or https:// URL`},
		{"short app secret", []string{"gateway", "--dev-auth", "--policy", "app", "--authz-app-url", "http://app.example", "--authz-app-secret", "hunter2"}, "--authz-app-secret: 7 bytes, want at least 32"},
		{"empty app secret file", []string{"gateway", "--dev-auth", "--policy", "app", "--authz-app-url", "http://app.example", "--authz-app-secret-file", emptySecret}, "--authz-app-secret-file " + emptySecret + ": the file is empty"},
		{"app subject with wildcard", []string{"gateway", "--dev-auth", "--policy", "app", "--authz-app-subject", "app.*"}, `app subject "app.*": want a NATS subject without wildcards`},
		{"app flag under another policy", []string{"gateway", "--dev-auth", "--authz-app-subject", "app.authz"}, "--authz-app-subject is for --policy app, not mutual"},
		{"zero app timeout", []string{"gateway", "--dev-auth", "--policy", "app", "--authz-app-subject", "app.authz", "--authz-app-timeout", "0s"}, "--authz-app-timeout 0s: want a positive duration"},
		{"connect proxy URL without secret", []string{"gateway", "--connect-proxy-url", "http://app.example/who"}, "--connect-proxy-url needs --authz-app-secret or --authz-app-secret-file"},
		{"connect proxy asking twice", []string{"gateway", "--connect-proxy-url", "http://app.example/who", "--connect-proxy-subject", "app.who", "--authz-app-secret", strings.Repeat("s", 32)}, "give only one of --connect-proxy-url and --connect-proxy-subject"},
		{"connect proxy URL not HTTP", []string{"gateway", "--connect-proxy-url", "ftp://app.example", "--authz-app-secret", strings.Repeat("s", 32)}, `connect proxy URL "ftp://app.example": want an http:// or https:// URL`},
		{"connect proxy with dev auth", []string{"gateway", "--dev-auth", "--connect-proxy-subject", "app.who"}, "--dev-auth and a connect proxy both admit clients that send no token: choose one"},
		{"connect proxy headers without a proxy", []string{"gateway", "--dev-auth", "--connect-proxy-headers", "User-Agent"}, "--connect-proxy-headers needs --connect-proxy-url or --connect-proxy-subject"},
		{"connect proxy timeout without a proxy", []string{"gateway", "--dev-auth", "--connect-proxy-timeout", "1s"}, "--connect-proxy-timeout needs --connect-proxy-url or --connect-proxy-subject"},
		{"connect proxy timeout over the handshake's", []string{"gateway", "--connect-proxy-subject", "app.who", "--connect-proxy-timeout", "10s"}, "connect proxy timeout 10s: want less than the handshake timeout 10s"},
		{"zero connect proxy timeout", []string{"gateway", "--connect-proxy-subject", "app.who", "--connect-proxy-timeout", "0s"}, "--connect-proxy-timeout 0s: want a positive duration"},
		{"connect proxy forwarding Cookie", []string{"gateway", "--connect-proxy-subject", "app.who", "--connect-proxy-headers", "User-Agent,cookie"}, "the cookies are always forwarded"},
		{"empty connect proxy header", []string{"gateway", "--connect-proxy-subject", "app.who", "--connect-proxy-headers", "User-Agent,"}, "--connect-proxy-headers"},
		{"connect proxy subject with wildcard", []string{"gateway", "--connect-proxy-subject", "app.>"}, `connect proxy subject "app.>": want a NATS subject without wildcards`},
		{"token policy without JWT", []string{"gateway", "--dev-auth", "--policy", "token"}, "--policy token reads the watch claim of JWTs"},
		{"zero token watch max", []string{"gateway", "--jwt-secret", strings.Repeat("s", 32), "--policy", "token", "--token-watch-max", "0"}, "--token-watch-max 0: want at least 1"},
		{"token watch max under another policy", []string{"gateway", "--dev-auth", "--token-watch-max", "5"}, "--token-watch-max is for --policy token, not mutual"},
		{"negative TTL", []string{"gateway", "--dev-auth", "--conn-ttl", "-1s"}, "--conn-ttl -1s: want a positive duration"},
		{"TTL under a second", []string{"gateway", "--dev-auth", "--conn-ttl", "500ms"}, "connection TTL 500ms: want at least 1s"},
		{"heartbeat not under TTL", []string{"gateway", "--dev-auth", "--conn-ttl", "2s", "--heartbeat-interval", "2s"}, "heartbeat interval 2s: want less than the connection TTL"},
		{"zero heartbeat", []string{"gateway", "--dev-auth", "--heartbeat-interval", "0s"}, "--heartbeat-interval 0s: want a positive duration"},
		{"negative grace", []string{"gateway", "--dev-auth", "--offline-grace", "-3s"}, "--offline-grace -3s"},
		{"zero batch", []string{"gateway", "--dev-auth", "--batch-interval", "0s"}, "--batch-interval 0s: want a positive duration"},
		{"batch too long", []string{"gateway", "--dev-auth", "--batch-interval", "1m"}, "batch interval 1m0s: want at most 10s"},
		{"zero pace", []string{"gateway", "--dev-auth", "--batch-pace", "0s"}, "--batch-pace 0s: want a positive duration"},
		{"pace under the interval", []string{"gateway", "--dev-auth", "--batch-interval", "100ms", "--batch-pace", "50ms"}, "batch pace 50ms: want at least the batch interval (100ms)"},
		{"pace too long", []string{"gateway", "--dev-auth", "--batch-pace", "1m"}, "batch pace 1m0s: want at most 10s"},
		{"not a duration", []string{"gateway", "--dev-auth", "--away-after", "soon"}, `--away-after "soon": want a duration such as 30s, 1m30s or 500ms`},
		{"duration without a unit", []string{"standalone", "--conn-ttl", "30"}, `--conn-ttl "30": want a duration such as 30s, 1m30s or 500ms`},
		{"not a whole number", []string{"gateway", "--dev-auth", "--max-conns", "1.5"}, `--max-conns "1.5": want a whole number`},
		{"not a number", []string{"gateway", "--dev-auth", "--rate-limit", "fast"}, `--rate-limit "fast": want a number`},
		{"not a boolean", []string{"gateway", "--dev-auth=maybe"}, `--dev-auth "maybe": want true or false`},
		{"zero subscriptions", []string{"gateway", "--dev-auth", "--max-subscriptions", "0"}, "--max-subscriptions 0: want at least 1"},
		{"negative max conns", []string{"gateway", "--dev-auth", "--max-conns", "-1"}, "--max-conns -1: want at least 0"},
		{"zero max registering", []string{"gateway", "--dev-auth", "--max-registering", "0"}, "--max-registering 0: want at least 1"},
		{"negative max registering", []string{"gateway", "--dev-auth", "--max-registering", "-1"}, "--max-registering -1: want at least 1"},
		{"tiny message size", []string{"gateway", "--dev-auth", "--max-message-size", "100"}, "max message size 100: want 256 to 1048576 bytes"},
		{"negative rate", []string{"gateway", "--dev-auth", "--rate-limit", "-1"}, "--rate-limit -1"},
		{"signal rate not a number", []string{"gateway", "--dev-auth", "--signal-rate", "NaN"}, "--signal-rate NaN: want a positive number"},
		{"API rate not a number", []string{"gateway", "--dev-auth", "--api-rate-limit", "nan"}, "--api-rate-limit NaN: want a positive number"},
		{"empty origin", []string{"gateway", "--dev-auth", "--allowed-origins", "https://a.example,,https://b.example"}, "--allowed-origins"},
		{"empty dev auth host", []string{"gateway", "--dev-auth", "--dev-auth-hosts", "a.example,"}, "--dev-auth-hosts"},
		{"dev auth host with a port", []string{"gateway", "--dev-auth", "--dev-auth-hosts", "dev.example:8080"}, `dev auth host "dev.example:8080": want a host name, without scheme or port`},
		{"bad gateway id", []string{"gateway", "--dev-auth", "--gateway-id", "gw.1"}, `gateway id "gw.1"`},
		{"bad log level", []string{"gateway", "--dev-auth", "--log-level", "loud"}, `--log-level "loud": want debug, info, warn or error`},
		{"bad log format", []string{"gateway", "--dev-auth", "--log-format", "xml"}, `--log-format "xml": want text or json`},
		{"too many replicas", []string{"gateway", "--dev-auth", "--replicas", "7"}, "--replicas 7: want 1 to 5"},
		{"gateway without auth", []string{"gateway"}, "the gateway has neither dev auth nor a JWT key"},
		{"TLS certificate without key", []string{"gateway", "--dev-auth", "--tls-cert", notPEM}, "--tls-cert and --tls-key go together"},
		{"TLS certificate not PEM", []string{"gateway", "--dev-auth", "--tls-cert", notPEM, "--tls-key", notPEM}, "failed to find any PEM data in certificate input"},
		{"bad trusted proxy", []string{"gateway", "--dev-auth", "--trusted-proxies", "10.0.0.0/8,lb.example"}, `--trusted-proxies "10.0.0.0/8,lb.example": "lb.example": want an address (192.0.2.7) or a prefix (10.0.0.0/8)`},
		{"bad API keys refresh", []string{"gateway", "--dev-auth", "--api-keys-refresh", "0s"}, "--api-keys-refresh 0s: want a positive duration"},
		{"missing API keys file", []string{"gateway", "--dev-auth", "--api-keys-file", filepath.Join(dir, "no-keys")}, "--api-keys-file: API keys: stat"},
		{"dev auth on every interface", []string{"gateway", "--dev-auth", "--listen", "0.0.0.0:0"}, "--dev-auth on 0.0.0.0:0, which is not a loopback address"},
		{"dev auth on an empty host", []string{"gateway", "--dev-auth", "--listen", ":0"}, "--dev-auth-allow-public"},
		{"standalone dev auth in public", []string{"standalone", "--data", data, "--dev-auth", "--listen", "0.0.0.0:0"}, "add --dev-auth-allow-public to do it anyway"},
		{"standalone in public without auth", []string{"standalone", "--data", data, "--listen", "0.0.0.0:0"}, "dev auth is off because --listen is not a loopback address"},
		{"bad listen address", []string{"gateway", "--dev-auth", "--listen", "nonsense"}, `--listen "nonsense"`},
		{"short secret", []string{"gateway", "--jwt-secret", "hunter2"}, "--jwt-secret: auth: invalid config: HMAC secret is 7 bytes: want at least 32"},
		{"empty secret file", []string{"gateway", "--jwt-secret-file", emptySecret}, "the file is empty"},
		{"missing secret file", []string{"gateway", "--jwt-secret-file", filepath.Join(dir, "nope")}, "--jwt-secret-file: open"},
		{"two keys", []string{"gateway", "--jwt-secret", strings.Repeat("s", 32), "--jwt-public-key", notPEM}, "give only one of --jwt-secret, --jwt-secret-file, --jwt-public-key and --jwt-keys"},
		{"key set and a secret", []string{"gateway", "--jwt-secret", strings.Repeat("s", 32), "--jwt-keys", notPEM}, "give only one of"},
		{"key set not JSON", []string{"gateway", "--jwt-keys", notPEM}, "--jwt-keys: auth: invalid config: key set " + notPEM + ": not a JWK Set"},
		{"missing key set", []string{"gateway", "--jwt-keys", filepath.Join(dir, "nope.json")}, "--jwt-keys: auth: invalid config: key set"},
		{"key set refresh without a key set", []string{"gateway", "--dev-auth", "--jwt-keys-refresh", "1m"}, "--jwt-keys-refresh needs --jwt-keys"},
		{"public key not PEM", []string{"gateway", "--jwt-public-key", notPEM}, "no PEM block found"},
		{"issuer without key", []string{"gateway", "--dev-auth", "--jwt-issuer", "https://id.example"}, "--jwt-issuer needs a JWT key"},
		{"NATS unreachable", []string{"gateway", "--dev-auth", "--listen", "127.0.0.1:0", "--nats-url", deadNATS}, "connect to nats"},
		{"two NATS credentials", []string{"reaper", "--nats-user", "u", "--nats-token", "t"}, "give only one of user/password, token, creds or nkey"},
		{"zero workers", []string{"reaper", "--workers", "0"}, "--workers 0: want at least 1"},
		{"fast sweep", []string{"reaper", "--sweep-interval", "10ms"}, "sweep interval 10ms: want at least 100ms"},
		{"negative cache", []string{"fanout", "--cache-size", "-1"}, "--cache-size -1: want at least 1"},
		{"zero ack wait", []string{"fanout", "--ack-wait", "0s"}, "--ack-wait 0s: want a positive duration"},
		{"bad metrics address", []string{"fanout", "--metrics-listen", "127.0.0.1:99999", "--nats-url", deadNATS}, "--metrics-listen"},
		{"standalone NATS port in use", []string{"standalone", "--data", data, "--listen", "127.0.0.1:0", "--nats-listen", heldAddr}, "--nats-listen " + heldAddr + ": listen tcp " + heldAddr + ": bind: address already in use"},
		{"standalone bad NATS port", []string{"standalone", "--data", data, "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:99999"}, "--nats-listen \"127.0.0.1:99999\": port must be 0 to 65535"},
		{"webhooks without url", []string{"webhooks", "--secret", strings.Repeat("s", 16)}, "--url: want the endpoint's URL"},
		{"webhooks without secret", []string{"webhooks", "--url", "https://app.example/hooks"}, "the deliveries must be signed: give --secret-file or --secret"},
		{"webhooks short previous secret", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--previous-secret", "hunter2"}, "previous secret of 7 bytes: want at least 16"},
		{"webhooks two previous secrets", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--previous-secret", strings.Repeat("p", 16), "--previous-secret-file", "x"}, "give only one of --previous-secret and --previous-secret-file"},
		{"webhooks short secret", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", "hunter2"}, "secret of 7 bytes: want at least 16"},
		{"webhooks two secrets", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--secret-file", emptySecret}, "give only one of --secret and --secret-file"},
		{"webhooks empty secret file", []string{"webhooks", "--url", "https://app.example/hooks", "--secret-file", emptySecret}, "--secret-file " + emptySecret + ": the file is empty"},
		{"webhooks bad scheme", []string{"webhooks", "--url", "ftp://app.example/hooks", "--secret", strings.Repeat("s", 16)}, `URL "ftp://app.example/hooks": want http:// or https://`},
		{"webhooks bad invisible", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--invisible", "hidden"}, `--invisible "hidden": want true or public`},
		{"webhooks bad users", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--users", "team_*,"}, `--users "team_*,": user pattern "": empty`},
		{"webhooks bad events", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--events", "status,presence"}, `--events "status,presence": event type "presence": want one of`},
		{"standalone bad webhook events", []string{"standalone", "--webhook-url", "https://app.example/hooks", "--webhook-secret", strings.Repeat("s", 16), "--webhook-events", "nope"}, `--webhook-events "nope": event type "nope"`},
		{"webhooks zero batch", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--batch-size", "0"}, "--batch-size 0: want at least 1"},
		{"webhooks zero rate", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--rate-limit", "0"}, "--rate-limit 0: want a positive number"},
		{"webhooks NaN rate", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--rate-limit", "NaN"}, "--rate-limit NaN: want a positive number"},
		{"webhooks backoffs crossed", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--min-backoff", "2m"}, "max backoff 1m0s: want at least the min backoff 2m0s"},
		{"webhooks bad consumer", []string{"webhooks", "--url", "https://app.example/hooks", "--secret", strings.Repeat("s", 16), "--consumer", "a.b"}, `consumer "a.b"`},
		{"standalone webhook flag without url", []string{"standalone", "--data", data, "--listen", "127.0.0.1:0", "--webhook-batch-size", "5"}, "--webhook-batch-size needs --webhook-url"},
		{"standalone webhook without secret", []string{"standalone", "--data", data, "--listen", "127.0.0.1:0", "--webhook-url", "http://127.0.0.1:1/hooks"}, "give --webhook-secret-file or --webhook-secret"},
		{"graph follow one id", []string{"graph", "follow", "alice"}, "want 2 arguments, got 1: usage: greendot graph follow [flags] <follower> <followee>"},
		{"graph flag after the ids", []string{"graph", "follow", "alice", "bob", "--nats-url", deadNATS}, "flags go before the arguments"},
		{"graph bad id", []string{"graph", "follow", "alice", "bob.>"}, `invalid user id "bob.>"`},
		{"graph self follow", []string{"graph", "follow", "alice", "alice"}, "alice cannot follow themselves"},
		{"graph bad privacy", []string{"graph", "privacy", "alice", "friends"}, `privacy "friends": want everyone, contacts or nobody`},
		{"graph unknown", []string{"graph", "befriend", "alice", "bob"}, `unknown graph command "befriend"`},
		{"buckets max age without feed", []string{"buckets", "--nats-url", deadNATS, "--feed-max-age", "1h"}, "--feed-max-age needs --feed"},
		{"buckets zero max age", []string{"buckets", "--nats-url", deadNATS, "--feed", "--feed-max-age", "0"}, "--feed-max-age 0s: want at least 1m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runOnce(t, tt.args...)
			if code != 1 {
				t.Errorf("exit code %d, want 1; stderr:\n%s", code, stderr)
			}
			last := lastLine(stderr)
			if !strings.HasPrefix(last, "greendot: ") || !strings.Contains(last, tt.want) {
				t.Errorf("last stderr line %q, want a 'greendot: ' line containing %q; stderr:\n%s", last, tt.want, stderr)
			}
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func TestBadEnvVar(t *testing.T) {
	t.Setenv("GREENDOT_CONN_TTL", "forever")
	code, _, stderr := runOnce(t, "gateway", "--dev-auth")
	if want := `GREENDOT_CONN_TTL "forever" (--conn-ttl): want a duration such as 30s, 1m30s or 500ms`; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("exit %d, stderr %q: want 1 and %q", code, stderr, want)
	}
	if err := os.Unsetenv("GREENDOT_CONN_TTL"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GREENDOT_POLICY", "friends")
	code, _, stderr = runOnce(t, "gateway", "--dev-auth")
	if code != 1 || !strings.Contains(stderr, `--policy "friends"`) {
		t.Errorf("exit %d, stderr %q: want 1 and the bad policy from the environment", code, stderr)
	}
	// A flag of one process kind reads its kind's variable.
	t.Setenv("GREENDOT_REAPER_WORKERS", "0")
	code, _, stderr = runOnce(t, "reaper")
	if code != 1 || !strings.Contains(stderr, "--workers 0: want at least 1") {
		t.Errorf("exit %d, stderr %q: want 1 and the bad --workers from GREENDOT_REAPER_WORKERS", code, stderr)
	}
}

// TestEveryFlagHasItsEnvVar walks every command's flags: each has one
// variable, GREENDOT_ and its name, or for a flag of one process kind
// GREENDOT_, the kind and its name. The kind is the command's, or for a
// flag standalone carries for a process it runs, that process's.
func TestEveryFlagHasItsEnvVar(t *testing.T) {
	t.Parallel()
	walkFlags(newApp(io.Discard, io.Discard).Commands, "greendot", func(cmd string, f cli.DocGenerationFlag) {
		name := f.Names()[0]
		want := []string{envVar(name), envVar(strings.Fields(cmd)[1] + "-" + name)}
		if strings.Fields(cmd)[1] == "standalone" {
			want = append(want, envVar("reaper-"+name), envVar("fanout-"+name))
		}
		if got := f.GetEnvVars(); len(got) != 1 || !slices.Contains(want, got[0]) {
			t.Errorf("%s --%s: env vars %v, want one of %v", cmd, name, got, want)
		}
		if f.GetUsage() == "" {
			t.Errorf("%s --%s has no usage text", cmd, name)
		}
	})
}

// TestEnvVarsMeanOneThing walks every command's flags and fails when one
// environment variable sets flags of different meaning: another name,
// usage or default. One environment can then serve every process: the
// reaper's --ack-wait and the fanout's are different settings, so they
// have different variables. greendot bench is left out: it is a load
// generator, not a greendot process, and is to become its own command.
func TestEnvVarsMeanOneThing(t *testing.T) {
	t.Parallel()
	type meaning struct{ name, usage, def string }
	// Variables whose flags differ in their default only, on purpose: the
	// variable sets the same thing wherever it is read.
	defaultsMayDiffer := map[string]bool{
		// Dev auth is on by default in standalone while --listen is
		// loopback; GREENDOT_DEV_AUTH turns the gateway's dev auth on or
		// off in both commands.
		"GREENDOT_DEV_AUTH": true,
	}
	seen := map[string]meaning{}
	where := map[string]string{}
	var cmds []*cli.Command
	for _, c := range newApp(io.Discard, io.Discard).Commands {
		if c.Name != "bench" {
			cmds = append(cmds, c)
		}
	}
	walkFlags(cmds, "greendot", func(cmd string, f cli.DocGenerationFlag) {
		for _, env := range f.GetEnvVars() {
			m := meaning{f.Names()[0], f.GetUsage(), f.GetDefaultText()}
			prev, ok := seen[env]
			if !ok {
				seen[env], where[env] = m, cmd
				continue
			}
			if _, ok := defaultsMayDiffer[env]; ok {
				prev.def, m.def = "", ""
			}
			if prev != m {
				t.Errorf("%s sets different things: --%s (%q, default %q) in %s and --%s (%q, default %q) in %s",
					env, prev.name, prev.usage, prev.def, where[env], m.name, m.usage, m.def, cmd)
			}
		}
	})
	for env := range defaultsMayDiffer {
		if _, ok := seen[env]; !ok {
			t.Errorf("%s, whose defaults may differ, is no flag's variable any more", env)
		}
	}
}

// walkFlags calls fn with every flag of every command under cmds, but
// --help.
func walkFlags(cmds []*cli.Command, path string, fn func(cmd string, f cli.DocGenerationFlag)) {
	for _, c := range cmds {
		p := path + " " + c.Name
		for _, f := range c.Flags {
			if f.Names()[0] != "help" {
				fn(p, f.(cli.DocGenerationFlag))
			}
		}
		walkFlags(c.Subcommands, p, fn)
	}
}

// parseFlags runs flags' parsing for args and calls fn with the result.
func parseFlags(t *testing.T, flags []cli.Flag, args []string, fn func(c *cli.Context) error) {
	t.Helper()
	app := &cli.App{
		Name:           "greendot",
		Writer:         io.Discard,
		ErrWriter:      io.Discard,
		ExitErrHandler: func(*cli.Context, error) {},
		Commands:       []*cli.Command{{Name: "x", Flags: flags, Action: fn}},
	}
	if err := app.Run(append([]string{"greendot", "x"}, args...)); err != nil {
		t.Fatal(err)
	}
}

// TestFlagDefaultsAreTheProcessDefaults: for every process, the config a
// command builds from its flags when given none equals the process's
// DefaultConfig in every field a flag sets. Defaults are written once, in
// the process's package, and --help shows them.
func TestFlagDefaultsAreTheProcessDefaults(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	gatewayFromFlags := func(t *testing.T, flags []cli.Flag) {
		t.Helper()
		var got gateway.Config
		var heartbeat time.Duration
		parseFlags(t, flags, nil, func(c *cli.Context) error {
			cfg, err := gatewayConfig(c, log, presence.BucketOptions{})
			got, heartbeat = cfg, c.Duration("heartbeat-interval")
			return err
		})
		// The heartbeat interval is left to the gateway unless it is given,
		// since its default depends on the TTL; its flag shows the default.
		if got.HeartbeatInterval != 0 {
			t.Errorf("heartbeat interval from no flags = %v, want 0 (the gateway's own)", got.HeartbeatInterval)
		}
		got.HeartbeatInterval = heartbeat
		// Fields no flag sets.
		got.Logger, got.Buckets, got.DevAuth, got.Tokens = nil, presence.BucketOptions{}, false, nil
		if want := gateway.DefaultConfig(); !reflect.DeepEqual(got, want) {
			t.Errorf("gateway config from default flags:\n%+v\nDefaultConfig:\n%+v", got, want)
		}
	}
	t.Run("gateway", func(t *testing.T) { gatewayFromFlags(t, gatewayCommand().Flags) })
	t.Run("reaper", func(t *testing.T) {
		var got reaper.Config
		parseFlags(t, reaperCommand().Flags, nil, func(c *cli.Context) error {
			cfg, err := reaperConfig(c, log, presence.BucketOptions{})
			got = cfg
			return err
		})
		got.Logger = nil
		if want := reaper.DefaultConfig(); !reflect.DeepEqual(got, want) {
			t.Errorf("reaper config from default flags %+v, DefaultConfig %+v", got, want)
		}
	})
	t.Run("fanout", func(t *testing.T) {
		var got fanout.Config
		parseFlags(t, fanoutCommand().Flags, nil, func(c *cli.Context) error {
			cfg, err := fanoutConfig(c, log, presence.BucketOptions{})
			got = cfg
			return err
		})
		got.Logger = nil
		if want := fanout.DefaultConfig(); !reflect.DeepEqual(got, want) {
			t.Errorf("fanout config from default flags %+v, DefaultConfig %+v", got, want)
		}
	})
	webhooksFromFlags := func(t *testing.T, flags []cli.Flag, prefix string) {
		t.Helper()
		var got webhook.Config
		args := []string{"--" + prefix + "url", "https://app.example/hooks", "--" + prefix + "secret", "0123456789abcdef"}
		parseFlags(t, flags, args, func(c *cli.Context) error {
			cfg, err := webhookConfig(c, prefix, log, presence.BucketOptions{})
			got = cfg
			return err
		})
		got.Logger, got.URL, got.Secret = nil, "", nil
		if want := webhook.DefaultConfig(); !reflect.DeepEqual(got, want) {
			t.Errorf("webhook config from default flags %+v, DefaultConfig %+v", got, want)
		}
	}
	t.Run("webhooks", func(t *testing.T) { webhooksFromFlags(t, webhooksCommand().Flags, "") })
	t.Run("standalone webhooks", func(t *testing.T) { webhooksFromFlags(t, standaloneCommand().Flags, "webhook-") })
	t.Run("standalone", func(t *testing.T) {
		flags := standaloneCommand().Flags
		gatewayFromFlags(t, flags)
		parseFlags(t, flags, nil, func(c *cli.Context) error {
			if got, want := c.Duration("sweep-interval"), reaper.DefaultConfig().SweepInterval; got != want {
				t.Errorf("standalone --sweep-interval defaults to %v, the reaper's default is %v", got, want)
			}
			return nil
		})
	})
}

// TestGatewayDerivedDefaults: defaults that derive from other flags follow
// them.
func TestGatewayDerivedDefaults(t *testing.T) {
	t.Parallel()
	var got gateway.Config
	parseFlags(t, gatewayCommand().Flags, []string{"--conn-ttl", "1s", "--offline-grace", "0", "--batch-interval", "100ms"}, func(c *cli.Context) error {
		cfg, err := gatewayConfig(c, slog.New(slog.DiscardHandler), presence.BucketOptions{})
		got = cfg
		return err
	})
	svc, err := gateway.New(nil, got)
	if err != nil {
		t.Fatal(err)
	}
	cfg := svc.Config()
	if cfg.HeartbeatInterval != cfg.ConnTTL/2 || cfg.OfflineGrace >= 0 || cfg.BatchInterval.Milliseconds() != 100 || cfg.BatchPace != cfg.BatchInterval {
		t.Errorf("--conn-ttl 1s --offline-grace 0 --batch-interval 100ms gave heartbeat %v, grace %v, batch %v, pace %v; want 500ms, none, 100ms, 100ms",
			cfg.HeartbeatInterval, cfg.OfflineGrace, cfg.BatchInterval, cfg.BatchPace)
	}
	if d := gateway.DefaultConfig(); d.BatchInterval != 10*time.Millisecond || gateway.DefaultBatchPace != 50*time.Millisecond {
		t.Errorf("default batch interval %v, pace %v; want 10ms, 50ms", d.BatchInterval, gateway.DefaultBatchPace)
	}
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:8080", true},
		{"127.0.0.2:0", true},
		{"[::1]:8080", true},
		{"localhost:8080", true},
		{":8080", false},
		{"0.0.0.0:8080", false},
		{"[::]:8080", false},
		{"192.0.2.10:8080", false},
	}
	for _, tt := range tests {
		got, err := isLoopback(tt.addr)
		if err != nil || got != tt.want {
			t.Errorf("isLoopback(%q) = %v, %v; want %v", tt.addr, got, err, tt.want)
		}
	}
}

// TestWSCompressionFlag: --ws-compression is on by default and
// --ws-compression=false (or GREENDOT_WS_COMPRESSION=false) turns
// permessage-deflate off, on a gateway and in standalone mode.
func TestWSCompressionFlag(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	for _, cmd := range []*cli.Command{gatewayCommand(), standaloneCommand()} {
		for _, tc := range []struct {
			args []string
			off  bool
		}{{nil, false}, {[]string{"--ws-compression=false"}, true}, {[]string{"--ws-compression"}, false}} {
			parseFlags(t, cmd.Flags, tc.args, func(c *cli.Context) error {
				cfg, err := gatewayConfig(c, log, presence.BucketOptions{})
				if err == nil && cfg.NoCompression != tc.off {
					t.Errorf("%s %q: NoCompression %v, want %v", cmd.Name, tc.args, cfg.NoCompression, tc.off)
				}
				return err
			})
		}
	}
}
