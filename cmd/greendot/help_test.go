package main

import (
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// flagLine matches the line of a flag among the options --help lists: its
// first name, three spaces in.
var flagLine = regexp.MustCompile(`(?m)^   (--[a-z0-9-]+)`)

// TestHelpListsEveryFlagOnce runs --help and -h of every command and checks
// that its options list each of its flags exactly once, each category
// once, and --help once.
func TestHelpListsEveryFlagOnce(t *testing.T) {
	t.Parallel()
	var check func(path []string, cmds []*cli.Command)
	check = func(path []string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Hidden {
				continue
			}
			cmd := append(append([]string(nil), path...), c.Name)
			for _, h := range []string{"--help", "-h"} {
				args := append(append([]string(nil), cmd...), h)
				line := "greendot " + strings.Join(args, " ")
				code, stdout, stderr := runOnce(t, args...)
				_, options, ok := strings.Cut(stdout, "\nOPTIONS:\n")
				if code != 0 || !ok {
					t.Errorf("%s: exit %d, no OPTIONS; stdout %q, stderr %q", line, code, stdout, stderr)
					continue
				}
				listed := map[string]int{}
				for _, m := range flagLine.FindAllStringSubmatch(options, -1) {
					listed[m[1]]++
				}
				want := map[string]bool{}
				cats := map[string]bool{}
				for _, f := range c.Flags {
					want["--"+f.Names()[0]] = true
					if f.Names()[0] != "help" {
						cats[f.(cli.CategorizableFlag).GetCategory()] = true
					}
				}
				if !want["--help"] {
					t.Errorf("%s: the command has no --help flag", line)
				}
				for name := range want {
					if listed[name] != 1 {
						t.Errorf("%s lists %s %d times, want once:\n%s", line, name, listed[name], options)
					}
				}
				for name := range listed {
					if !want[name] {
						t.Errorf("%s lists %s, which is not one of its flags", line, name)
					}
				}
				for cat := range cats {
					if n := strings.Count(options, "\n   "+cat+"\n"); n != 1 {
						t.Errorf("%s has the heading %q %d times, want once", line, cat, n)
					}
				}
			}
			check(cmd, c.Subcommands)
		}
	}
	check(nil, newApp(io.Discard, io.Discard).Commands)
}
