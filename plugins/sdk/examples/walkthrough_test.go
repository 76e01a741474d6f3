// Package examples holds the tests that keep docs/writing-an-adapter.md
// true: its code is the walkthrough module's code, and that module builds
// and passes the conformance suite.
package examples

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the embedded blocks of docs/writing-an-adapter.md from the files they show")

const (
	// repoRoot is the repository's root, from this package's directory.
	repoRoot = "../../.."
	// docFile and moduleDir are relative to repoRoot.
	docFile   = "docs/writing-an-adapter.md"
	moduleDir = "plugins/sdk/examples/walkthrough"
)

// An embedded block in the doc is
//
//	<!-- embed: <path from the repository root> [<Go type name>] -->
//	```<lang>
//	the file, or the type's declaration
//	```
//	<!-- /embed -->
var (
	embedOpen  = regexp.MustCompile(`^<!-- embed: (\S+)(?: (\S+))? -->$`)
	embedClose = "<!-- /embed -->"
	fence      = "```"
)

type block struct {
	path, decl string
	line       int    // of the embed marker, 1-based
	got        string // the block's content as the doc has it
}

// parseDoc returns the doc's embedded blocks and the doc with each
// block's content replaced by what source returns (for -update).
func parseDoc(t *testing.T, doc string, source func(path, decl string) (string, error)) ([]block, string) {
	t.Helper()
	lines := strings.SplitAfter(doc, "\n")
	var blocks []block
	var out strings.Builder
	for i := 0; i < len(lines); i++ {
		out.WriteString(lines[i])
		m := embedOpen.FindStringSubmatch(strings.TrimRight(lines[i], "\n"))
		if m == nil {
			continue
		}
		b := block{path: m[1], decl: m[2], line: i + 1}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], fence) {
			t.Fatalf("%s:%d: an embed marker must be followed by a fenced block", docFile, b.line)
		}
		i++
		out.WriteString(lines[i])
		end := -1
		for j := i + 1; j+1 < len(lines); j++ {
			if strings.TrimRight(lines[j], "\n") == fence && strings.TrimRight(lines[j+1], "\n") == embedClose {
				end = j
				break
			}
		}
		if end < 0 {
			t.Fatalf("%s:%d: the block is not closed by ``` and %s", docFile, b.line, embedClose)
		}
		b.got = strings.Join(lines[i+1:end], "")
		blocks = append(blocks, b)
		want, err := source(b.path, b.decl)
		if err != nil {
			want = b.got
		}
		out.WriteString(want)
		out.WriteString(lines[end])
		i = end
	}
	return blocks, out.String()
}

// source is what a block must hold: the file, or the declaration of the
// type decl in the Go file path, without its doc comment.
func source(path, decl string) (string, error) {
	src, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(path)))
	if err != nil {
		return "", err
	}
	if decl == "" {
		return string(src), nil
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return "", err
	}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE || len(gd.Specs) != 1 {
			continue
		}
		if ts := gd.Specs[0].(*ast.TypeSpec); ts.Name.Name == decl {
			return string(src[fset.Position(gd.Pos()).Offset:fset.Position(gd.End()).Offset]) + "\n", nil
		}
	}
	return "", fmt.Errorf("%s declares no type %s on its own", path, decl)
}

// moduleFiles lists the walkthrough module's files the doc must show
// (all but go.sum), relative to the repository root.
func moduleFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	root := filepath.Join(repoRoot, moduleDir)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "go.sum" {
			return err
		}
		rel, err := filepath.Rel(repoRoot, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestWalkthroughDoc fails when a code block of docs/writing-an-adapter.md
// differs from the file (or declaration) it shows, or when a file of the
// walkthrough module is not shown. `go test ./plugins/sdk/examples -run
// TestWalkthroughDoc -update` rewrites the blocks from the files.
func TestWalkthroughDoc(t *testing.T) {
	t.Parallel()
	docPath := filepath.Join(repoRoot, docFile)
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	blocks, updated := parseDoc(t, string(doc), source)
	if *update {
		if updated != string(doc) {
			if err := os.WriteFile(docPath, []byte(updated), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("rewrote the embedded blocks of %s", docFile)
		}
		blocks, _ = parseDoc(t, updated, source)
	}

	shown := map[string]int{}
	for _, b := range blocks {
		want, err := source(b.path, b.decl)
		if err != nil {
			t.Errorf("%s:%d: %v", docFile, b.line, err)
			continue
		}
		if b.decl == "" {
			shown[b.path]++
		}
		if b.got != want {
			t.Errorf("%s:%d: the block embedding %s %s differs from the source (-doc +source):\n%s\nrun: go test ./plugins/sdk/examples -run TestWalkthroughDoc -update",
				docFile, b.line, b.path, b.decl, cmp.Diff(strings.Split(b.got, "\n"), strings.Split(want, "\n")))
		}
	}
	files := moduleFiles(t)
	for _, f := range files {
		switch shown[f] {
		case 0:
			t.Errorf("%s does not show %s: embed it (<!-- embed: %s -->)", docFile, f, f)
		case 1:
		default:
			t.Errorf("%s shows %s %d times", docFile, f, shown[f])
		}
	}
	for f := range shown {
		if strings.HasPrefix(f, moduleDir+"/") && !slices.Contains(files, f) {
			t.Errorf("%s shows %s, which the module does not have", docFile, f)
		}
	}
}

// TestParseDoc checks the block parser on a small document.
func TestParseDoc(t *testing.T) {
	t.Parallel()
	doc := "text\n<!-- embed: a.go -->\n```go\nold\n```\n<!-- /embed -->\nmore\n<!-- embed: b.go T -->\n```go\nkept\n```\n<!-- /embed -->\n"
	blocks, out := parseDoc(t, doc, func(path, decl string) (string, error) {
		if path == "a.go" {
			return "new\nlines\n", nil
		}
		return "kept\n", nil
	})
	if len(blocks) != 2 || blocks[0].got != "old\n" || blocks[1].decl != "T" || blocks[1].line != 8 {
		t.Fatalf("blocks %+v", blocks)
	}
	want := "text\n<!-- embed: a.go -->\n```go\nnew\nlines\n```\n<!-- /embed -->\nmore\n<!-- embed: b.go T -->\n```go\nkept\n```\n<!-- /embed -->\n"
	if out != want {
		t.Errorf("updated doc:\n%s", cmp.Diff(want, out))
	}
}

// goTool is the go command of the toolchain running this test: go test
// puts that toolchain's bin directory first in PATH (runtime.GOROOT, which
// this used, is deprecated since Go 1.24).
func goTool() string {
	return "go"
}

// TestWalkthroughModule vets the walkthrough module and runs its tests,
// the conformance suite among them, with this test's toolchain, offline
// and without changing go.mod or go.sum: they must already be complete.
func TestWalkthroughModule(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the walkthrough module and runs the conformance suite on it")
	}
	dir := filepath.Join(repoRoot, moduleDir)
	env := append(os.Environ(),
		"GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local",
		"GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=readonly"),
	)
	for _, args := range [][]string{{"vet", "./..."}, {"test", "-count=1", "./..."}} {
		cmd := exec.Command(goTool(), args...)
		cmd.Dir = dir
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("go %s in %s: %v\n%s\nIf go.mod or go.sum is out of date (the SDK's dependencies changed), run there:\n"+
				"  cp ../../../../go.sum . && GOFLAGS=-mod=mod GOPROXY=off go mod tidy -e\n"+
				"then go test -run TestWalkthroughDoc -update in plugins/sdk/examples.",
				strings.Join(args, " "), moduleDir, err, out.String())
		}
		t.Logf("go %s:\n%s", strings.Join(args, " "), out.String())
	}
}
