package faulttest

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

	"github.com/greendot/greendot/internal/tooltest"
)

// commandFlags returns the flags `greendot <command> --help` lists, by
// name, with their environment variables: what the built binary accepts.
func commandFlags(tb testing.TB, command string) map[string]string {
	tb.Helper()
	out, err := exec.Command(greendotBinary(tb), command, "--help").CombinedOutput()
	if err != nil {
		tb.Fatalf("greendot %s --help: %v\n%s", command, err, out)
	}
	flags := map[string]string{}
	line := regexp.MustCompile(`^\s+--([a-z0-9-]+)\b.*?(?:\[\$([A-Z0-9_]+)\])?\s*$`)
	for _, l := range strings.Split(string(out), "\n") {
		if m := line.FindStringSubmatch(l); m != nil {
			flags[m[1]] = m[2]
		}
	}
	if len(flags) == 0 {
		tb.Fatalf("greendot %s --help lists no flags:\n%s", command, out)
	}
	return flags
}

// composeFile is what the checks read of compose.yaml.
type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	StopGracePeriod string `yaml:"stop_grace_period"`
}

// interpolate replaces compose's ${NAME:-default} with the default (or the
// environment's value), as `docker compose` does with no .env file.
func interpolate(s string) string {
	re := regexp.MustCompile(`\$\{([A-Z0-9_]+)(?::-([^}]*))?\}`)
	return re.ReplaceAllStringFunc(s, func(m string) string {
		p := re.FindStringSubmatch(m)
		if v, ok := os.LookupEnv(p[1]); ok {
			return v
		}
		return p[2]
	})
}

// loadCompose parses compose.yaml, merge keys and all, and interpolates
// its environment values.
func loadCompose(tb testing.TB) composeFile {
	tb.Helper()
	data, err := os.ReadFile(repoFile("compose.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		tb.Fatalf("compose.yaml: %v", err)
	}
	for name, svc := range f.Services {
		for k, v := range svc.Environment {
			svc.Environment[k] = interpolate(v)
		}
		f.Services[name] = svc
	}
	return f
}

// confVars returns the variables a NATS configuration file and the files
// it includes read from the environment.
func confVars(tb testing.TB, name string) []string {
	tb.Helper()
	data, err := os.ReadFile(repoFile(name))
	if err != nil {
		tb.Fatal(err)
	}
	defined := map[string]bool{}
	var refs []string
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") {
			continue
		}
		if m := regexp.MustCompile(`^([A-Z_]+)\s*=`).FindStringSubmatch(l); m != nil {
			defined[m[1]] = true
		}
		if m := regexp.MustCompile(`^include\s+"([^"]+)"`).FindStringSubmatch(l); m != nil {
			dir := name[:strings.LastIndex(name, "/")+1]
			refs = append(refs, confVars(tb, dir+m[1])...)
		}
		// Quoted strings are subjects ("$JS.API..."), never variables.
		unquoted := regexp.MustCompile(`"[^"]*"`).ReplaceAllString(l, "")
		for _, m := range regexp.MustCompile(`\$([A-Z_]+)`).FindAllStringSubmatch(unquoted, -1) {
			refs = append(refs, m[1])
		}
	}
	refs = slices.DeleteFunc(refs, func(v string) bool { return defined[v] })
	slices.Sort(refs)
	return slices.Compact(refs)
}

// The roles of compose.yaml's greendot services: the NATS user each must
// connect as.
var composeRoles = map[string]string{
	"setup": "operator", "gateway1": "gateway", "gateway2": "gateway",
	"reaper1": "reaper", "reaper2": "reaper", "fanout1": "fanout", "fanout2": "fanout",
}

// TestComposeFile checks compose.yaml without Docker: it parses, every NATS
// node's environment loads nats.conf with nats-server's own parser into the
// node it should be, every greendot command line and GREENDOT_ variable
// exists in the built binary, every process connects as its own role with
// that role's password, health checks hit what each process serves, the
// start order holds, and nginx sends /ws to every gateway.
func TestComposeFile(t *testing.T) {
	tooltest.Long(t)
	f := loadCompose(t)
	var names []string
	for name := range f.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	want := []string{"fanout1", "fanout2", "gateway1", "gateway2", "lb", "nats1", "nats2", "nats3", "reaper1", "reaper2", "setup"}
	if !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}

	vars := confVars(t, "nats.conf")
	natsURLs := []string{}
	for _, node := range []string{"nats1", "nats2", "nats3"} {
		svc := f.Services[node]
		t.Run(node, func(t *testing.T) {
			if !strings.HasPrefix(svc.Image, "nats:") {
				t.Errorf("image %q, want the official nats image", svc.Image)
			}
			if !slices.Equal(svc.Command, []string{"nats-server", "--config", "/etc/nats/nats.conf"}) {
				t.Errorf("command %q", svc.Command)
			}
			for _, v := range []string{"./nats.conf:/etc/nats/nats.conf:ro", "./deploy/nats:/etc/nats/deploy/nats:ro", node + "-data:/data"} {
				if !slices.Contains(svc.Volumes, v) {
					t.Errorf("volumes %q lack %q", svc.Volumes, v)
				}
			}
			if _, ok := f.Volumes[node+"-data"]; !ok {
				t.Errorf("volume %s-data is not declared", node)
			}
			for _, v := range vars {
				if _, ok := svc.Environment[v]; !ok {
					t.Errorf("environment lacks %s, which nats.conf reads", v)
				}
			}
			if svc.Healthcheck == nil || !strings.Contains(strings.Join(svc.Healthcheck.Test, " "), "http://127.0.0.1:8222/healthz") {
				t.Errorf("healthcheck %+v, want the monitoring port's /healthz", svc.Healthcheck)
			}
			// nats.conf, loaded with this node's environment, is this node.
			for _, v := range vars {
				t.Setenv(v, svc.Environment[v])
			}
			opts, err := server.ProcessConfigFile(repoFile("nats.conf"))
			if err != nil {
				t.Fatalf("nats.conf with %s's environment: %v", node, err)
			}
			if opts.ServerName != node || !opts.JetStream || opts.Port != 4222 || opts.HTTPPort != 8222 ||
				opts.Cluster.Port != 6222 || opts.Cluster.Name == "" || len(opts.Routes) != 3 || opts.SystemAccount != "SYS" {
				t.Errorf("%s: name %q, jetstream %v, port %d, http %d, cluster %q:%d, %d routes, system account %q",
					node, opts.ServerName, opts.JetStream, opts.Port, opts.HTTPPort, opts.Cluster.Name, opts.Cluster.Port, len(opts.Routes), opts.SystemAccount)
			}
			for _, r := range opts.Routes {
				if pw, _ := r.User.Password(); r.User.Username() != "route" || pw != svc.Environment["NATS_ROUTE_PASSWORD"] {
					t.Errorf("route %s does not carry the route user's password", r.Redacted())
				}
			}
			for _, u := range opts.Users {
				role := u.Username
				if pw := svc.Environment["NATS_"+strings.ToUpper(role)+"_PASSWORD"]; pw == "" || u.Password != pw {
					t.Errorf("user %s has no password of its own", role)
				}
			}
		})
		natsURLs = append(natsURLs, "nats://"+node+":4222")
	}

	natsEnv := f.Services["nats1"].Environment
	flagsOf := map[string]map[string]string{}
	for _, name := range []string{"setup", "gateway1", "gateway2", "reaper1", "reaper2", "fanout1", "fanout2"} {
		svc := f.Services[name]
		t.Run(name, func(t *testing.T) {
			if svc.Image != "greendot:local" || svc.Build != "." {
				t.Errorf("image %q build %v, want greendot:local built from the Dockerfile", svc.Image, svc.Build)
			}
			if len(svc.Command) == 0 {
				t.Fatal("no command")
			}
			cmd := svc.Command[0]
			flags, ok := flagsOf[cmd]
			if !ok {
				flags = commandFlags(t, cmd)
				flagsOf[cmd] = flags
			}
			given := map[string]string{}
			for i := 1; i < len(svc.Command); i++ {
				arg := svc.Command[i]
				name, ok := strings.CutPrefix(arg, "--")
				if !ok {
					t.Errorf("argument %q is not a flag", arg)
					continue
				}
				name, val, hasVal := strings.Cut(name, "=")
				if _, ok := flags[name]; !ok {
					t.Errorf("greendot %s has no flag --%s", cmd, name)
					continue
				}
				if !hasVal && i+1 < len(svc.Command) && !strings.HasPrefix(svc.Command[i+1], "--") {
					i++
					val = svc.Command[i]
				}
				given[name] = val
			}
			envs := map[string]bool{}
			for _, e := range flags {
				envs[e] = true
			}
			for k := range svc.Environment {
				if !envs[k] {
					t.Errorf("greendot %s reads no variable %s", cmd, k)
				}
			}
			env := svc.Environment
			role := composeRoles[name]
			if env["GREENDOT_NATS_USER"] != role || env["GREENDOT_NATS_PASSWORD"] != natsEnv["NATS_"+strings.ToUpper(role)+"_PASSWORD"] {
				t.Errorf("connects as %q with another password than nats.conf gives it; want role %s", env["GREENDOT_NATS_USER"], role)
			}
			if env["GREENDOT_REPLICAS"] != "3" || env["GREENDOT_NATS_URL"] != strings.Join(natsURLs, ",") {
				t.Errorf("replicas %q, nats url %q; want 3 replicas over every node", env["GREENDOT_REPLICAS"], env["GREENDOT_NATS_URL"])
			}
			if name == "setup" {
				if cmd != "buckets" {
					t.Errorf("setup runs %q, want buckets", cmd)
				}
				for _, n := range []string{"nats1", "nats2", "nats3"} {
					if svc.DependsOn[n].Condition != "service_healthy" {
						t.Errorf("setup does not wait for %s to be healthy", n)
					}
				}
				return
			}
			if svc.DependsOn["setup"].Condition != "service_completed_successfully" {
				t.Errorf("does not wait for setup to complete")
			}
			addr := given["metrics-listen"]
			if cmd == "gateway" {
				addr = given["listen"]
				grace, err := time.ParseDuration(svc.StopGracePeriod)
				drain, _ := time.ParseDuration(given["drain-period"])
				if err != nil || drain == 0 || grace < drain+5*time.Second {
					t.Errorf("stop_grace_period %q with --drain-period %q: Docker would kill the gateway mid-drain", svc.StopGracePeriod, given["drain-period"])
				}
			}
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				t.Fatalf("listen address %q: %v", addr, err)
			}
			if svc.Healthcheck == nil || !strings.Contains(strings.Join(svc.Healthcheck.Test, " "), "http://127.0.0.1:"+port+"/readyz") {
				t.Errorf("healthcheck %+v, want /readyz on port %s", svc.Healthcheck, port)
			}
		})
	}

	t.Run("lb", func(t *testing.T) {
		lb := f.Services["lb"]
		for _, g := range []string{"gateway1", "gateway2"} {
			if lb.DependsOn[g].Condition != "service_healthy" {
				t.Errorf("lb does not wait for %s", g)
			}
		}
		if !slices.Contains(lb.Volumes, "./deploy/nginx/nginx.conf:/etc/nginx/nginx.conf:ro") {
			t.Errorf("lb volumes %q", lb.Volumes)
		}
		for _, p := range lb.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("port %q is published beyond loopback, while the gateways run dev auth", p)
			}
		}
		conf, err := os.ReadFile(repoFile("deploy/nginx/nginx.conf"))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"server gateway1:8080", "server gateway2:8080", "listen 8080;", "location /ws",
			"proxy_set_header Upgrade $http_upgrade;", "proxy_set_header Connection $connection_upgrade;", "proxy_http_version 1.1;"} {
			if !strings.Contains(string(conf), s) {
				t.Errorf("nginx.conf lacks %q", s)
			}
		}
		// A gateway answers 503 to one request that it cannot take now
		// (draining, full, registering as many as it may, NATS slow), and
		// nginx passes that request on (proxy_next_upstream http_503); but
		// nginx also counts the 503 as a failure of the server, and with
		// max_fails above 0 would send nothing to it for fail_timeout: one
		// 503 from each gateway, and every client is refused 502.
		servers := regexp.MustCompile(`(?m)^\s*server\s+gateway\d:8080\b.*;`).FindAllString(string(conf), -1)
		if len(servers) != 2 {
			t.Errorf("nginx.conf has gateway servers %q, want two", servers)
		}
		for _, l := range servers {
			if !strings.Contains(l, " max_fails=0") {
				t.Errorf("nginx.conf: %q is taken out of the group on a 503; want max_fails=0", strings.TrimSpace(l))
			}
		}
		// Behind nginx every client of the HTTP API has its address: the
		// limit per client is nginx's, and the gateways' per address is
		// above what nginx lets through for one client.
		rate := regexp.MustCompile(`limit_req_zone \$binary_remote_addr zone=(\w+):\S+ rate=(\d+)r/s;`).FindStringSubmatch(string(conf))
		if rate == nil {
			t.Fatal("nginx.conf limits no client's API requests (limit_req_zone per $binary_remote_addr)")
		}
		api := regexp.MustCompile(`(?s)location / \{[^}]*limit_req zone=` + rate[1] + ` burst=\d+ nodelay;[^}]*\}`)
		if !api.Match(conf) || !strings.Contains(string(conf), "limit_req_status 429;") {
			t.Errorf("nginx.conf's location / does not apply the zone %s, answering 429", rate[1])
		}
		perClient, _ := strconv.Atoi(rate[2])
		for _, g := range []string{"gateway1", "gateway2"} {
			cmd := f.Services[g].Command
			i := slices.Index(cmd, "--api-address-rate-limit")
			if i < 0 || i+1 >= len(cmd) {
				t.Errorf("%s keeps the default --api-address-rate-limit, which all of nginx's clients would share", g)
				continue
			}
			if v, err := strconv.ParseFloat(cmd[i+1], 64); err != nil || v <= float64(perClient) {
				t.Errorf("%s: --api-address-rate-limit %s, want more than nginx's %d a second per client", g, cmd[i+1], perClient)
			}
		}
	})

	// compose.yaml has the passwords set in a .env file beside it: that
	// file must stay out of commits and of the image's build context.
	t.Run("env file", func(t *testing.T) {
		for _, ignore := range []string{".gitignore", ".dockerignore"} {
			if !ignores(t, ignore, ".env") {
				t.Errorf("%s does not leave out .env, which holds the passwords", ignore)
			}
		}
	})
}

// ignores reports whether an ignore file of the repository (.gitignore,
// .dockerignore) has a line that leaves out the file name at its root.
func ignores(tb testing.TB, ignoreFile, name string) bool {
	tb.Helper()
	data, err := os.ReadFile(repoFile(ignoreFile))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		pattern := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(l, "**/"), "/"), "/")
		if ok, _ := path.Match(pattern, name); ok {
			return true
		}
	}
	return false
}

// TestDockerfile checks the Dockerfile against the module: a multi-stage
// build of ./cmd/greendot with the Go release go.mod asks for, a static
// binary (checked by building it the same way and reading its ELF
// headers), and a final image that runs as a user other than root.
func TestDockerfile(t *testing.T) {
	tooltest.Long(t)
	data, err := os.ReadFile(repoFile("Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)
	mod, err := os.ReadFile(repoFile("go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(mod))
	if goVersion == nil || !strings.Contains(df, "FROM golang:"+goVersion[1]+"-") {
		t.Errorf("the build stage does not use Go %v, which go.mod asks for", goVersion)
	}
	if n := len(regexp.MustCompile(`(?m)^FROM `).FindAllString(df, -1)); n < 2 {
		t.Errorf("%d stages, want a build stage and a small final one", n)
	}
	if _, err := dockerBuildArgs(df); err != nil {
		t.Fatal(err)
	}
	user := regexp.MustCompile(`(?m)^USER (\S+)`).FindStringSubmatch(df)
	if user == nil || strings.HasPrefix(user[1], "0") || strings.HasPrefix(user[1], "root") {
		t.Errorf("final image user %v, want a user other than root", user)
	}
	if !strings.Contains(df, `ENTRYPOINT ["greendot"]`) {
		t.Error("the entrypoint is not greendot")
	}

	// The tests' greendot is built as the Dockerfile builds it: it must be
	// static.
	out := greendotBinary(t)
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs %v", libs)
	}
}

// dockerBuildArgs returns the arguments of the Dockerfile's go build of
// ./cmd/greendot after "go build", without its -o and the package, with
// the default of ARG VERSION, and checks that it builds with
// CGO_ENABLED=0.
func dockerBuildArgs(dockerfile string) ([]string, error) {
	build := regexp.MustCompile(`(?s)RUN (CGO_ENABLED=0 go build .*?) ./cmd/greendot`).FindStringSubmatch(dockerfile)
	if build == nil {
		return nil, errors.New("the Dockerfile has no CGO_ENABLED=0 go build of ./cmd/greendot")
	}
	version := regexp.MustCompile(`(?m)^ARG VERSION=(\S+)`).FindStringSubmatch(dockerfile)
	if version == nil {
		return nil, errors.New("the Dockerfile has no ARG VERSION with a default")
	}
	words := shellWords(strings.ReplaceAll(strings.ReplaceAll(build[1], "\\\n", " "), "${VERSION}", version[1]))
	if len(words) < 3 || words[0] != "CGO_ENABLED=0" || words[1] != "go" || words[2] != "build" {
		return nil, fmt.Errorf("the Dockerfile's build command is %q", words)
	}
	var args []string
	for i := 3; i < len(words); i++ {
		if words[i] == "-o" {
			i++
			continue
		}
		args = append(args, words[i])
	}
	return args, nil
}

// shellWords splits a command line into words, as a shell would for plain
// words and double-quoted strings.
func shellWords(s string) []string {
	var (
		words  []string
		cur    strings.Builder
		quoted bool
		inWord bool
	)
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (r == ' ' || r == '\t' || r == '\n'):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// TestTaskfile checks Taskfile.yml: go-task v3, and the tasks the README
// and docs/deploy.md name, doing what they say.
func TestTaskfile(t *testing.T) {
	tooltest.Long(t)
	data, err := os.ReadFile(repoFile("Taskfile.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Version string `yaml:"version"`
		Tasks   map[string]struct {
			Desc string   `yaml:"desc"`
			Deps []string `yaml:"deps"`
			Cmds []string `yaml:"cmds"`
		} `yaml:"tasks"`
	}
	if err := yaml.Unmarshal(data, &tf); err != nil {
		t.Fatalf("Taskfile.yml: %v", err)
	}
	if tf.Version != "3" {
		t.Errorf("version %q, want 3", tf.Version)
	}
	for name, want := range map[string]string{
		"build":          "go build -o bin/greendot ./cmd/greendot",
		"build:nats":     "go build -o bin/nats-server github.com/nats-io/nats-server/v2",
		"test":           "go test {{.CLI_ARGS}} ./...",
		"run":            "bin/greendot standalone",
		"cluster":        "bash deploy/cluster/cluster.sh up",
		"cluster:down":   "bash deploy/cluster/cluster.sh down",
		"cluster:status": "bash deploy/cluster/cluster.sh status",
	} {
		task, ok := tf.Tasks[name]
		if !ok {
			t.Errorf("no task %s", name)
			continue
		}
		if task.Desc == "" || !slices.ContainsFunc(task.Cmds, func(c string) bool { return strings.HasPrefix(c, want) }) {
			t.Errorf("task %s: %+v, want a description and %q", name, task, want)
		}
	}
	if deps := tf.Tasks["cluster"].Deps; !slices.Contains(deps, "build") || !slices.Contains(deps, "build:nats") {
		t.Errorf("task cluster depends on %v, want build and build:nats", deps)
	}
}

// goTool returns the go command of the toolchain running the tests.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

// clusterPorts are the ports deploy/cluster/cluster.sh uses, before its
// offset.
var clusterPorts = []int{4222, 4223, 4224, 6222, 6223, 6224, 8222, 8223, 8224, 8081, 8082, 9101, 9102, 9201, 9202}

// freeOffset returns a port offset with which every port of the local
// cluster is free.
func freeOffset(tb testing.TB) int {
	tb.Helper()
	for range 50 {
		// Below the kernel's ephemeral range (32768 and up on Linux), so
		// that no outgoing connection takes a port between this check
		// and the cluster's start.
		off := 6000 + rand.IntN(17000)
		ok := true
		for _, p := range clusterPorts {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+off))
			if err != nil {
				ok = false
				break
			}
			_ = ln.Close()
		}
		if ok {
			return off
		}
	}
	tb.Fatal("no free ports for a local cluster")
	return 0
}

// natsServerBinary builds nats-server beside greendot, once, as task
// build:nats does; with greendot's build flags, so that the server's
// packages, which greendot embeds, come from the build cache.
var natsServerBinary = sync.OnceValues(func() (string, error) {
	path := binary.dir + "/nats-server"
	cmd := exec.Command(goTool(), "build", "-trimpath", "-o", path, "github.com/nats-io/nats-server/v2")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build nats-server: %v\n%s", err, out)
	}
	return path, nil
})

// TestLocalCluster runs what `task cluster` runs, deploy/cluster/cluster.sh,
// on free ports: three nats-server processes built from the module, the
// buckets set up as the operator, two gateways, two reapers and two
// fanouts. Two users on different gateways see each other, then
// `cluster.sh down` stops every process it started.
func TestLocalCluster(t *testing.T) {
	tooltest.Long(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("cluster.sh needs curl")
	}
	bin := greendotBinary(t)
	nats, err := natsServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	binDir := bin[:strings.LastIndex(bin, "/")]
	if nats != binDir+"/nats-server" {
		t.Fatalf("nats-server built to %s, not beside greendot", nats)
	}
	runDir := t.TempDir()
	off := freeOffset(t)
	// run runs cluster.sh with the test's directories and offset; env
	// overrides them.
	run := func(arg string, env ...string) (string, error) {
		cmd := exec.Command("bash", repoFile("deploy/cluster/cluster.sh"), arg)
		cmd.Env = append(os.Environ(), "GREENDOT_BIN_DIR="+binDir, "GREENDOT_RUN_DIR="+runDir, "GREENDOT_PORT_OFFSET="+strconv.Itoa(off))
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	script := func(arg string, env ...string) string {
		t.Helper()
		out, err := run(arg, env...)
		if err != nil {
			t.Fatalf("cluster.sh %s: %v\n%s", arg, err, out)
		}
		return out
	}
	t.Cleanup(func() { script("down") })

	// Without the binaries, up says which one is missing, and status and
	// down need none.
	noBin := "GREENDOT_BIN_DIR=" + t.TempDir() + "/none"
	if out, err := run("up", noBin); err == nil || !strings.Contains(out, "/none/greendot is missing") {
		t.Errorf("up without a bin directory: %v\n%s", err, out)
	}
	if out := script("status", noBin); strings.Count(out, " stopped") != 9 {
		t.Errorf("status without a bin directory:\n%s", out)
	}
	script("down", noBin)

	t.Log(script("up"))
	status := script("status")
	if n := strings.Count(status, " ready "); n != 9 {
		t.Errorf("%d of 9 processes ready:\n%s", n, status)
	}

	// The operator's password is in the run directory: follow as operator.
	secrets := map[string]string{}
	sf, err := os.Open(runDir + "/secrets.env")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(sf)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			secrets[k] = v
		}
	}
	sf.Close()
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", 4222+off)
	for _, e := range [][2]string{{"alice", "bob"}, {"bob", "alice"}} {
		cmd := exec.Command(bin, "graph", "follow", "--nats-url", natsURL, "--replicas", "3", e[0], e[1])
		cmd.Env = append(os.Environ(), "GREENDOT_NATS_USER=operator", "GREENDOT_NATS_PASSWORD="+secrets["NATS_OPERATOR_PASSWORD"])
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("graph follow: %v\n%s", err, out)
		}
	}
	gw1 := fmt.Sprintf("ws://127.0.0.1:%d/ws", 8081+off)
	gw2 := fmt.Sprintf("ws://127.0.0.1:%d/ws", 8082+off)
	alice := dialClient(t, "alice", []string{gw1}, time.Second, false)
	bob := dialClient(t, "bob", []string{gw2}, time.Second, false)
	alice.subscribe("bob")
	expectViews(t, 15*time.Second, "alice sees bob online across gateways", []*liveClient{alice}, truth{"bob": "online"})
	if err := bob.setStatus("busy", 15*time.Second); err != nil {
		t.Fatal(err)
	}
	expectViews(t, 15*time.Second, "alice sees bob busy", []*liveClient{alice}, truth{"bob": "busy"})
	alice.close()
	bob.close()

	var pids []int
	for _, name := range []string{"n1", "n2", "n3", "gateway1", "gateway2", "reaper1", "reaper2", "fanout1", "fanout2"} {
		b, err := os.ReadFile(runDir + "/" + name + ".pid")
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		pids = append(pids, pid)
	}
	// down stops what up started, whatever bin directory it is given.
	t.Log(script("down", "GREENDOT_BIN_DIR="+t.TempDir()))
	for _, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(b), binDir) {
				t.Errorf("process %d still runs after down", pid)
			}
		}
	}
}
