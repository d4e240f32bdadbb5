// Package doctest reads the code samples of the repository's docs, for the
// tests that run them: every fenced code block of docs/*.md is run by a
// test, which finds it with Sample (TestEveryDocSampleIsRun checks that
// each block is).
package doctest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
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
