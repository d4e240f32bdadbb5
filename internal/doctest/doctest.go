// Package doctest reads the code samples of the repository's docs, for the
// tests that run them: every fenced code block of docs/*.md is run by a
// test, which finds it with Sample (TestEveryDocSampleIsRun checks that
// each block is).
package doctest

import (
	"bufio"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Block is one fenced code block of a page.
type Block struct {
	// Path is the page's, from the repository's root (docs/integration.md).
	Path string
	// Lang is the word after the opening fence ("go", "sh"), or empty.
	Lang string
	// Line is the opening fence's line number, from 1.
	Line int
	// Text is the block's lines, each ending in a newline.
	Text string
}

// String names the block as an error message should: page:line (lang).
func (b Block) String() string { return fmt.Sprintf("%s:%d (%s block)", b.Path, b.Line, b.Lang) }

// Root returns the repository's root: the nearest directory holding
// go.mod, from the working directory (a test's package directory) up.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		dir = up
	}
}

// Blocks returns the fenced code blocks of the page at path, from the
// repository's root.
func Blocks(path string) ([]Block, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(root, path))
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var (
		blocks []Block
		cur    *Block
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &Block{Path: path, Lang: strings.TrimPrefix(line, "```"), Line: n}
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.Text += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: code block never closed", path, cur.Line)
	}
	return blocks, nil
}

// Sample returns the one code block of the page at path (from the
// repository's root) that contains needle, and fails tb unless there is
// exactly one. The test that calls it runs the block: path and needle are
// string literals, which TestEveryDocSampleIsRun reads from the test's
// source to know which blocks are run.
func Sample(tb testing.TB, path, needle string) Block {
	tb.Helper()
	blocks, err := Blocks(path)
	if err != nil {
		tb.Fatal(err)
	}
	var found []Block
	for _, b := range blocks {
		if strings.Contains(b.Text, needle) {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		tb.Fatalf("%s: %d code blocks contain %q, want 1", path, len(found), needle)
	}
	return found[0]
}

// importPath is an import path of an import declaration's line.
var importPath = regexp.MustCompile(`"[^"]+"`)

// Verbatim fails tb unless the Go code of b is in the source file (a path
// from the working directory) line for line, leading white space aside,
// so that the test running that source runs the sample. The block's
// import declaration is checked against the file's imports instead.
// replace holds pairs of old and new text: what the source has in place
// of the block's (a test server's URL for a production one).
func Verbatim(tb testing.TB, b Block, file string, replace ...string) {
	tb.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		tb.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), file, src, parser.ImportsOnly)
	if err != nil {
		tb.Fatal(err)
	}
	var imports []string
	for _, is := range f.Imports {
		imports = append(imports, is.Path.Value)
	}
	text := b.Text
	if len(replace) > 0 {
		text = strings.NewReplacer(replace...).Replace(text)
	}
	var code []string
	inImport := false
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "import (":
			inImport = true
		case inImport && l == ")":
			inImport = false
		case inImport || strings.HasPrefix(l, "import "):
			for _, p := range importPath.FindAllString(l, -1) {
				if !slices.Contains(imports, p) {
					tb.Errorf("%s imports %s, which %s does not", b, p, file)
				}
			}
		case len(code) == 0 && l == "":
		default:
			code = append(code, l)
		}
	}
	var lines []string
	for _, l := range strings.Split(string(src), "\n") {
		lines = append(lines, strings.TrimSpace(l))
	}
	for i := 0; i+len(code) <= len(lines); i++ {
		if slices.Equal(lines[i:i+len(code)], code) {
			return
		}
	}
	tb.Fatalf("%s is not in %s line for line (after replacing %s); its code:\n%s", b, file, strconv.Quote(strings.Join(replace, " ")), strings.Join(code, "\n"))
}
