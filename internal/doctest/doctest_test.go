package doctest_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/greendot/greendot/internal/doctest"
)

// pagesRunElsewhere are the pages whose code blocks a test runs without
// doctest.Sample.
var pagesRunElsewhere = map[string]string{
	"docs/operations.md": "e2e/ops's TestOperationsPageCommands runs every block, and fails on one it cannot run",
	"docs/BENCHMARKS.md": "its commands are the load generator's, run by whoever measures; cmd/greendot-bench's TestFlagsDoc keeps its flag table true",
}

// notRunYet are the blocks no test runs yet, by page and a string of the
// block: each is a debt, and the list only shrinks (a block listed here
// that a test now runs fails the check too).
var notRunYet = map[string][]string{}

// sampleCall is a call of doctest.Sample with string literals, as a test
// that runs a block makes it.
var sampleCall = regexp.MustCompile("doctest\\.Sample\\(\\s*\\w+,\\s*(\"[^\"]*\"),\\s*(\"(?:[^\"\\\\]|\\\\.)*\"|`[^`]*`)\\s*\\)")

// TestEveryDocSampleIsRun: every fenced code block of docs/*.md is run by
// a test, which finds it with doctest.Sample (or, for the pages of
// pagesRunElsewhere, by a test of its own).
func TestEveryDocSampleIsRun(t *testing.T) {
	root, err := doctest.Root()
	if err != nil {
		t.Fatal(err)
	}
	needles := map[string][]string{} // by page
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range sampleCall.FindAllStringSubmatch(string(src), -1) {
			page, err1 := strconv.Unquote(m[1])
			needle, err2 := strconv.Unquote(m[2])
			if err1 != nil || err2 != nil {
				t.Errorf("%s: doctest.Sample(%s, %s): not string literals", path, m[1], m[2])
				continue
			}
			needles[page] = append(needles[page], needle)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	claimed := func(page, text string, in []string) string {
		for _, n := range in {
			if strings.Contains(text, n) {
				return n
			}
		}
		return ""
	}
	run := 0
	for _, p := range pages {
		page := "docs/" + filepath.Base(p)
		if _, ok := pagesRunElsewhere[page]; ok {
			continue
		}
		blocks, err := doctest.Blocks(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			first, _, _ := strings.Cut(b.Text, "\n")
			byTest := claimed(page, b.Text, needles[page])
			debt := claimed(page, b.Text, notRunYet[page])
			switch {
			case byTest != "" && debt != "":
				t.Errorf("%s, %q: a test runs it now (Sample %q): take it off notRunYet", b, first, byTest)
			case byTest == "" && debt == "":
				t.Errorf("%s, %q: no test runs it: have one find it with doctest.Sample(t, %q, ...) and run it", b, first, page)
			case byTest != "":
				run++
			}
		}
	}
	if run < 20 {
		t.Errorf("%d code blocks run: are the tests' calls of doctest.Sample still seen?", run)
	}
}
