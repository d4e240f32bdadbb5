package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

var update = flag.Bool("update", false, "rewrite docs/cli.md from the command's flags")

// docPath is docs/cli.md, from this package's directory.
var docPath = filepath.Join("..", "..", "docs", "cli.md")

// TestCLIDoc fails when docs/cli.md is not what the flags say. Regenerate
// it with: go test ./cmd/greendot -run TestCLIDoc -update
func TestCLIDoc(t *testing.T) {
	t.Parallel()
	got := cliDoc(newApp(io.Discard, io.Discard))
	if *update {
		if err := os.MkdirAll(filepath.Dir(docPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(docPath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("%v: generate it with go test ./cmd/greendot -run TestCLIDoc -update", err)
	}
	if string(want) != got {
		t.Errorf("docs/cli.md is out of date: regenerate it with go test ./cmd/greendot -run TestCLIDoc -update")
	}
	// Whatever the generator does, every flag and its variable must be
	// in the document.
	walkFlags(newApp(io.Discard, io.Discard).Commands, "greendot", func(cmd string, f cli.DocGenerationFlag) {
		for _, s := range []string{"`--" + f.Names()[0] + "`", "`" + f.GetEnvVars()[0] + "`"} {
			if !strings.Contains(string(want), s) {
				t.Errorf("docs/cli.md does not mention %s of %s", s, cmd)
			}
		}
	})
}

const docIntro = `# greendot command line

One binary, ` + "`greendot`" + `, runs every greendot process and the operator's graph tools.
This page is generated from the command's own flags by
` + "`go test ./cmd/greendot -run TestCLIDoc -update`" + `, and a test fails when it is out
of date; ` + "`greendot <command> --help`" + ` prints the same.

- **Environment.** Every flag can also be set with an environment variable:
  ` + "`GREENDOT_`" + ` and the flag's name in upper snake case (` + "`--nats-url`" + ` is
  ` + "`GREENDOT_NATS_URL`" + `). A flag of one process kind has the kind's name too:
  the reaper's ` + "`--ack-wait`" + ` is ` + "`GREENDOT_REAPER_ACK_WAIT`" + `, the fanout's
  ` + "`GREENDOT_FANOUT_ACK_WAIT`" + `. A variable means the same in every command that
  reads it (the NATS connection, logging and gateway flags are shared), so one
  environment can serve every process. A flag on the command line wins over
  the variable, and the variable over the default. An empty variable sets a
  text flag to empty (` + "`GREENDOT_NATS_LISTEN=`" + ` turns the embedded server's
  listener off) and a switch to false; for numbers and durations it is
  ignored.
- **Renamed variables.** Each flag of the reaper and of the fanout, and
  ` + "`greendot graph show --json`" + `, has a variable of its own; these commands no
  longer read the old names, and no command reads them:
  ` + "`GREENDOT_ACK_WAIT`" + ` is now ` + "`GREENDOT_REAPER_ACK_WAIT`" + ` and
  ` + "`GREENDOT_FANOUT_ACK_WAIT`" + `; ` + "`GREENDOT_METRICS_LISTEN`" + `,
  ` + "`GREENDOT_REAPER_METRICS_LISTEN`" + ` and ` + "`GREENDOT_FANOUT_METRICS_LISTEN`" + `;
  ` + "`GREENDOT_WORKERS`" + `, ` + "`GREENDOT_REAPER_WORKERS`" + `; ` + "`GREENDOT_SWEEP_INTERVAL`" + `
  (of ` + "`greendot reaper`" + ` and ` + "`greendot standalone`" + `), ` + "`GREENDOT_REAPER_SWEEP_INTERVAL`" + `;
  ` + "`GREENDOT_CACHE_SIZE`" + `, ` + "`GREENDOT_FANOUT_CACHE_SIZE`" + `; ` + "`GREENDOT_JSON`" + ` (of
  ` + "`greendot graph show`" + `), ` + "`GREENDOT_GRAPH_JSON`" + `.
- **Durations** are Go durations: ` + "`10ms`, `1s`, `5m`, `1h30m`" + `.
- **Exit codes.** 0 after a clean shutdown (SIGINT or SIGTERM) or a successful
  command; 1 with a one-line error on stderr for a bad flag, a bad argument or
  a failure. A second signal during the shutdown ends the process at once,
  with 130 after SIGINT and 143 after SIGTERM. Logs go to stderr;
  standalone's "where to connect" line, the graph commands' answers and the
  table of ` + "`greendot buckets`" + ` go to stdout.
- **Who may connect.** A gateway needs dev auth or a JWT key, or it refuses to
  start. Dev auth (` + "`?user=<id>`" + `, no proof) is off by default in ` + "`greendot gateway`" + `,
  and on by default in ` + "`greendot standalone`" + ` while ` + "`--listen`" + ` is a loopback
  address. On any other address it needs ` + "`--dev-auth`" + ` and ` + "`--dev-auth-allow-public`" + `
  both. Whenever it is on, the log says so at WARN level.
- **Timings** work down to 1s TTLs and 1ms batches, for tests and demos:
  ` + "`greendot standalone --conn-ttl 1s --offline-grace 1s --batch-interval 1ms`" + `.
- **Buckets.** Every process creates the buckets it needs if they are missing.
  Give every process of a deployment the same ` + "`--replicas`" + `: a process with
  another value reconfigures the buckets. The graph commands only create
  missing buckets and never change existing ones.
`

// cliDoc renders the reference of every command and flag of app.
func cliDoc(app *cli.App) string {
	var b strings.Builder
	b.WriteString(docIntro)
	b.WriteString("\n## Commands\n\n")
	for _, c := range app.Commands {
		for _, leaf := range leaves(c, "greendot") {
			fmt.Fprintf(&b, "- [`%s`](#%s): %s\n", leaf.path, anchor(leaf.path), text(leaf.cmd.Usage))
		}
	}
	for _, c := range app.Commands {
		if len(visible(c.Subcommands)) > 0 {
			fmt.Fprintf(&b, "\n## greendot %s\n\n%s.\n", c.Name, text(capitalize(c.Usage)))
			if c.Description != "" {
				fmt.Fprintf(&b, "\n%s\n", text(unwrap(c.Description)))
			}
		}
		for _, leaf := range leaves(c, "greendot") {
			level := "##"
			if leaf.path != "greendot "+c.Name {
				level = "###"
			}
			writeCommand(&b, level, leaf)
		}
	}
	return b.String()
}

type leaf struct {
	path string
	cmd  *cli.Command
}

// leaves returns the commands under c (c itself when it has none that are
// not hidden) with their full command lines.
func leaves(c *cli.Command, parent string) []leaf {
	path := parent + " " + c.Name
	subs := visible(c.Subcommands)
	if len(subs) == 0 {
		return []leaf{{path, c}}
	}
	var out []leaf
	for _, s := range subs {
		out = append(out, leaves(s, path)...)
	}
	return out
}

// visible returns the commands that are not hidden.
func visible(cmds []*cli.Command) []*cli.Command {
	var out []*cli.Command
	for _, c := range cmds {
		if !c.Hidden {
			out = append(out, c)
		}
	}
	return out
}

func writeCommand(b *strings.Builder, level string, l leaf) {
	fmt.Fprintf(b, "\n%s %s\n\n", level, l.path)
	usage := l.path + " [flags]"
	if l.cmd.ArgsUsage != "" {
		usage += " " + l.cmd.ArgsUsage
	}
	fmt.Fprintf(b, "    %s\n\n%s.\n", usage, text(capitalize(l.cmd.Usage)))
	if l.cmd.Description != "" && !strings.Contains(l.path, "graph ") {
		fmt.Fprintf(b, "\n%s\n", text(unwrap(l.cmd.Description)))
	}
	var cats []string
	byCat := map[string][]cli.DocGenerationFlag{}
	for _, f := range l.cmd.Flags {
		if f.Names()[0] == "help" {
			continue
		}
		df := f.(cli.DocGenerationFlag)
		cat := f.(cli.CategorizableFlag).GetCategory()
		if !slices.Contains(cats, cat) {
			cats = append(cats, cat)
		}
		byCat[cat] = append(byCat[cat], df)
	}
	for _, cat := range cats {
		fmt.Fprintf(b, "\n%s:\n\n| flag | environment variable | default | meaning |\n| --- | --- | --- | --- |\n", cat)
		for _, f := range byCat[cat] {
			def := f.GetDefaultText()
			if uq, err := strconv.Unquote(def); err == nil {
				def = uq
			}
			switch {
			case def == "":
				def = "none"
			case strings.Contains(def, " "):
				def = text(def)
			default:
				def = "`" + def + "`"
			}
			fmt.Fprintf(b, "| `--%s` | `%s` | %s | %s |\n", f.Names()[0], f.GetEnvVars()[0], cell(def), cell(text(f.GetUsage())))
		}
	}
}

// anchor returns the GitHub anchor of a heading.
func anchor(heading string) string {
	return strings.ReplaceAll(strings.ToLower(heading), " ", "-")
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// unwrap joins the lines of a --help description into one paragraph.
func unwrap(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// text escapes the characters of plain text that markdown would take for
// HTML.
func text(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// cell escapes text for a markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}
