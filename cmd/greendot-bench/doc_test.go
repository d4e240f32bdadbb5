package main

import (
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
	"text/template"

	"github.com/urfave/cli/v2"
)

// The lines around the generated section of docs/BENCHMARKS.md.
const (
	docBegin = "<!-- Generated from the command's flags by go test ./cmd/greendot-bench -run TestFlagsDoc -update -->\n"
	docEnd   = "<!-- End of the generated flags -->\n"
)

// benchmarksPath is docs/BENCHMARKS.md, from this package's directory.
const benchmarksPath = "../../docs/BENCHMARKS.md"

var rewrite = flag.Bool("update", false, "rewrite the flags section of docs/BENCHMARKS.md from the command's flags")

// docFlag is a flag as the table shows it.
type docFlag struct{ Name, Env, Default, Usage string }

// docCategory is a table of flags.
type docCategory struct {
	Category string
	Flags    []docFlag
}

var docTable = template.Must(template.New("flags").Parse(`{{range .}}
{{.Category}}:

| flag | environment variable | default | meaning |
| --- | --- | --- | --- |
{{range .Flags}}| ` + "`--{{.Name}}`" + ` | ` + "`{{.Env}}`" + ` | {{.Default}} | {{.Usage}} |
{{end}}{{end}}`))

// flagsDoc renders the command's flags as markdown tables, one per
// category, in the order of their first flag.
func flagsDoc(t *testing.T) string {
	t.Helper()
	var cats []docCategory
	index := map[string]int{}
	for _, f := range flags() {
		df := f.(cli.DocGenerationFlag)
		cat := f.(cli.CategorizableFlag).GetCategory()
		if _, ok := index[cat]; !ok {
			index[cat] = len(cats)
			cats = append(cats, docCategory{Category: cat})
		}
		def := df.GetDefaultText()
		if uq, err := strconv.Unquote(def); err == nil {
			def = uq
		}
		switch {
		case def == "":
			def = "none"
		case !strings.Contains(def, " "):
			def = "`" + def + "`"
		}
		c := &cats[index[cat]]
		c.Flags = append(c.Flags, docFlag{Name: df.Names()[0], Env: df.GetEnvVars()[0], Default: def, Usage: df.GetUsage()})
	}
	var b strings.Builder
	if err := docTable.Execute(&b, cats); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestFlagsDoc fails when the flags section of docs/BENCHMARKS.md is not
// what the flags say. Regenerate it with:
// go test ./cmd/greendot-bench -run TestFlagsDoc -update
func TestFlagsDoc(t *testing.T) {
	data, err := os.ReadFile(benchmarksPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	before, rest, ok1 := strings.Cut(doc, docBegin)
	_, after, ok2 := strings.Cut(rest, docEnd)
	if !ok1 || !ok2 {
		t.Fatalf("docs/BENCHMARKS.md lacks the lines %q and %q around its flags", docBegin, docEnd)
	}
	want := before + docBegin + flagsDoc(t) + "\n" + docEnd + after
	if *rewrite {
		if err := os.WriteFile(benchmarksPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if doc != want {
		t.Errorf("the flags in docs/BENCHMARKS.md are out of date: regenerate them with go test ./cmd/greendot-bench -run TestFlagsDoc -update")
	}
}
