package fsops

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/textscan"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/fs"
)

var ctx = context.Background()

// newTree serves a fresh temporary directory; home is /home.
func newTree(t *testing.T, ops ...fs.PathOp) (*Tree, string) {
	t.Helper()
	dir := fs.NewDir(t, "fsops", append([]fs.PathOp{fs.WithDir("home")}, ops...)...)
	root, err := os.OpenRoot(dir.Path())
	assert.NilError(t, err)
	t.Cleanup(func() { root.Close() })
	return NewTree(root, "/home"), dir.Path()
}

func codeOf(t *testing.T, err error) contract.Code {
	t.Helper()
	var se *contract.Error
	assert.Assert(t, errors.As(err, &se), "want a sandbox error, got %v", err)
	return se.Code
}

func TestResolve(t *testing.T) {
	tr := NewTree(nil, "/home")
	tests := []struct{ in, name, display string }{
		{"/", ".", "/"},
		{"/a/b", "a/b", "/a/b"},
		{"/a/../b", "b", "/b"},
		{"/../../etc/passwd", "etc/passwd", "/etc/passwd"},
		{"rel/x", "home/rel/x", "/home/rel/x"},
		{"../../x", "x", "/x"},
		{"/a//b/./", "a/b", "/a/b"},
		{".", "home", "/home"},
	}
	for _, tc := range tests {
		name, display := tr.Resolve(tc.in)
		assert.Equal(t, name, tc.name, tc.in)
		assert.Equal(t, display, tc.display, tc.in)
	}
}

func FuzzResolve(f *testing.F) {
	for _, s := range []string{"/", "a/../../b", "/../x", "..", "a//b/"} {
		f.Add(s)
	}
	tr := NewTree(nil, "/home")
	f.Fuzz(func(t *testing.T, p string) {
		name, display := tr.Resolve(p)
		if !strings.HasPrefix(display, "/") {
			t.Fatalf("display %q is not absolute", display)
		}
		if name != "." && (strings.HasPrefix(name, "/") || name == ".." || strings.HasPrefix(name, "../") || strings.Contains(name, "/../") || strings.HasSuffix(name, "/..")) {
			t.Fatalf("Resolve(%q) = %q climbs out of the root", p, name)
		}
	})
}

func TestWriteReadStat(t *testing.T) {
	tr, dir := newTree(t)
	out, err := tr.Write(ctx, &contract.FsWriteRequest{Path: "/a/b/c.txt", Mode: 0o640, Parents: true}, strings.NewReader("hello"))
	assert.NilError(t, err)
	assert.DeepEqual(t, out, &contract.FsWriteResponse{BytesWritten: 5, Path: "/a/b/c.txt"})
	st, err := os.Stat(filepath.Join(dir, "a/b/c.txt"))
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o640), "the mode is exact, not masked by the umask")

	meta, body, err := tr.Read(ctx, &contract.FsReadRequest{Path: "/a/b/c.txt"})
	assert.NilError(t, err)
	data, _ := io.ReadAll(body)
	body.Close()
	assert.Equal(t, string(data), "hello")
	assert.Equal(t, meta.Size, uint64(5))
	assert.Equal(t, meta.Mode, contract.Mode(0o640))

	e, err := tr.Stat(ctx, &contract.FsStatRequest{Path: "/a/b/c.txt"})
	assert.NilError(t, err)
	assert.Equal(t, e.Name, "c.txt")
	assert.Check(t, !e.IsDir && !e.IsSymlink && e.Size == 5)

	// A relative path is under home; an existing file is truncated and
	// gets the new mode.
	_, err = tr.Write(ctx, &contract.FsWriteRequest{Path: "notes", Mode: 0o600}, strings.NewReader("long content"))
	assert.NilError(t, err)
	_, err = tr.Write(ctx, &contract.FsWriteRequest{Path: "notes", Mode: 0o644}, strings.NewReader("x"))
	assert.NilError(t, err)
	b, _ := os.ReadFile(filepath.Join(dir, "home/notes"))
	assert.Equal(t, string(b), "x")

	assert.NilError(t, os.Symlink("a/b/c.txt", filepath.Join(dir, "link")))
	e, err = tr.Stat(ctx, &contract.FsStatRequest{Path: "/link"})
	assert.NilError(t, err)
	assert.Check(t, e.IsSymlink)
	e, err = tr.Stat(ctx, &contract.FsStatRequest{Path: "/"})
	assert.NilError(t, err)
	assert.Check(t, e.IsDir && e.Name == "/")
}

func TestErrors(t *testing.T) {
	tr, dir := newTree(t, fs.WithFile("file", "x"), fs.WithDir("full", fs.WithFile("f", "")), fs.WithSymlink("out", "/"))
	tests := []struct {
		name string
		call func() error
		want contract.Code
	}{
		{"write with a missing parent", func() error {
			_, err := tr.Write(ctx, &contract.FsWriteRequest{Path: "/no/such/f"}, nil)
			return err
		}, contract.S211},
		{"mkdir with a missing parent", func() error {
			_, err := tr.Mkdir(ctx, &contract.FsMkdirRequest{Path: "/no/such"})
			return err
		}, contract.S211},
		{"stat of nothing", func() error { _, err := tr.Stat(ctx, &contract.FsStatRequest{Path: "/nothing"}); return err }, contract.S211},
		{"ls of a file", func() error { _, err := tr.Ls(ctx, &contract.FsLsRequest{Path: "/file"}); return err }, contract.S212},
		{"read of a directory", func() error { _, _, err := tr.Read(ctx, &contract.FsReadRequest{Path: "/full"}); return err }, contract.S212},
		{"write over a directory", func() error {
			_, err := tr.Write(ctx, &contract.FsWriteRequest{Path: "/full"}, nil)
			return err
		}, contract.S212},
		{"write below a file", func() error {
			_, err := tr.Write(ctx, &contract.FsWriteRequest{Path: "/file/x", Parents: true}, nil)
			return err
		}, contract.S212},
		{"mkdir -p over a file", func() error {
			_, err := tr.Mkdir(ctx, &contract.FsMkdirRequest{Path: "/file", Parents: true})
			return err
		}, contract.S212},
		{"mkdir of an existing directory", func() error { _, err := tr.Mkdir(ctx, &contract.FsMkdirRequest{Path: "/full"}); return err }, contract.S213},
		{"mv onto an existing path", func() error {
			_, err := tr.Mv(ctx, &contract.FsMvRequest{Src: "/file", Dst: "/full/f"})
			return err
		}, contract.S213},
		{"rm of a full directory", func() error { _, err := tr.Rm(ctx, &contract.FsRmRequest{Path: "/full"}); return err }, contract.S214},
		{"mv over a full directory", func() error {
			_, err := tr.Mv(ctx, &contract.FsMvRequest{Src: "/home", Dst: "/full", Overwrite: true})
			return err
		}, contract.S214},
		{"write through a symlink out", func() error {
			_, err := tr.Write(ctx, &contract.FsWriteRequest{Path: "/out/tmp/escaped"}, nil)
			return err
		}, contract.S215},
		{"rm of the root", func() error { _, err := tr.Rm(ctx, &contract.FsRmRequest{Path: "/", Recursive: true}); return err }, contract.S210},
		{"mv of the root", func() error { _, err := tr.Mv(ctx, &contract.FsMvRequest{Src: "/", Dst: "/x"}); return err }, contract.S215},
		{"mv into itself", func() error { _, err := tr.Mv(ctx, &contract.FsMvRequest{Src: "/full", Dst: "/full/in"}); return err }, contract.S210},
		{"name too long", func() error {
			_, err := tr.Write(ctx, &contract.FsWriteRequest{Path: "/" + strings.Repeat("n", 300)}, nil)
			return err
		}, contract.S216},
		{"grep with a bad glob", func() error {
			_, err := tr.Grep(ctx, &contract.FsGrepRequest{Path: "/", Pattern: "x", IncludeGlob: []string{"[a"}})
			return err
		}, contract.S210},
		{"grep with a bad pattern", func() error { _, err := tr.Grep(ctx, &contract.FsGrepRequest{Path: "/", Pattern: "("}); return err }, contract.S217},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			assert.Equal(t, codeOf(t, err), tc.want, "%v", err)
			assert.Check(t, !strings.Contains(err.Error(), dir), "host path leaked: %v", err)
		})
	}
	_, err := tr.Write(ctx, &contract.FsWriteRequest{Path: "/no/such/f"}, nil)
	assert.DeepEqual(t, contract.AsError(err, "").Fix, map[string]any{"parents": true})
	_, err = os.Stat("/tmp/escaped")
	assert.Check(t, os.IsNotExist(err), "a write escaped the root")
}

func TestMkdirRmMvChmodLs(t *testing.T) {
	tr, dir := newTree(t)
	out, err := tr.Mkdir(ctx, &contract.FsMkdirRequest{Path: "/d", Mode: 0o750})
	assert.NilError(t, err)
	assert.Check(t, out.Created)
	st, _ := os.Stat(filepath.Join(dir, "d"))
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o750))
	out, err = tr.Mkdir(ctx, &contract.FsMkdirRequest{Path: "/d", Parents: true})
	assert.NilError(t, err)
	assert.Check(t, !out.Created)
	_, err = tr.Mkdir(ctx, &contract.FsMkdirRequest{Path: "/d/e/f", Parents: true, Mode: 0o700})
	assert.NilError(t, err)
	for _, f := range []string{"/d/z", "/d/a", "/d/e/f/x"} {
		_, err = tr.Write(ctx, &contract.FsWriteRequest{Path: f, Mode: 0o644}, strings.NewReader(f))
		assert.NilError(t, err)
	}
	ls, err := tr.Ls(ctx, &contract.FsLsRequest{Path: "/d"})
	assert.NilError(t, err)
	var names []string
	for _, e := range ls.Entries {
		names = append(names, e.Name)
	}
	assert.DeepEqual(t, names, []string{"a", "e", "z"})

	ch, err := tr.Chmod(ctx, &contract.FsChmodRequest{Path: "/d", Mode: 0o700, Recursive: true})
	assert.NilError(t, err)
	assert.Equal(t, ch.Updated, uint64(6))
	st, _ = os.Stat(filepath.Join(dir, "d/e/f/x"))
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o700))
	ch, err = tr.Chmod(ctx, &contract.FsChmodRequest{Path: "/d/a", Mode: 0o4755})
	assert.NilError(t, err)
	assert.Equal(t, ch.Updated, uint64(1))
	e, _ := tr.Stat(ctx, &contract.FsStatRequest{Path: "/d/a"})
	assert.Equal(t, e.Mode, contract.Mode(0o4755))

	mv, err := tr.Mv(ctx, &contract.FsMvRequest{Src: "/d/a", Dst: "/d/z", Overwrite: true})
	assert.NilError(t, err)
	assert.Check(t, mv.Moved)
	b, _ := os.ReadFile(filepath.Join(dir, "d/z"))
	assert.Equal(t, string(b), "/d/a")
	_, err = tr.Mv(ctx, &contract.FsMvRequest{Src: "/d/z", Dst: "/nope/z"})
	assert.Equal(t, codeOf(t, err), contract.S211)

	rm, err := tr.Rm(ctx, &contract.FsRmRequest{Path: "/d/z"})
	assert.NilError(t, err)
	assert.Check(t, rm.Removed)
	_, err = tr.Rm(ctx, &contract.FsRmRequest{Path: "/d", Recursive: true})
	assert.NilError(t, err)
	_, err = os.Stat(filepath.Join(dir, "d"))
	assert.Check(t, os.IsNotExist(err))
}

func TestGrep(t *testing.T) {
	tr, _ := newTree(t,
		fs.WithFile("a.go", "package a\n// TODO: one\r\nx := 1\n"),
		fs.WithFile("bin.dat", "TODO\x00binary"),
		fs.WithDir("sub", fs.WithFile("b.txt", "todo two\n"+strings.Repeat("é", 10)+" TODO long\n")),
		fs.WithDir("vendor", fs.WithFile("v.go", "// TODO vendored\n")),
		fs.WithFile("nolf.txt", "TODO at the end"),
	)
	run := func(req contract.FsGrepRequest) ([]string, bool) {
		t.Helper()
		if req.MaxMatches == 0 {
			req.MaxMatches = 100
		}
		if req.MaxLineBytes == 0 {
			req.MaxLineBytes = 4096
		}
		out, err := tr.Grep(ctx, &req)
		assert.NilError(t, err)
		var got []string
		for _, m := range out.Matches {
			got = append(got, m.Path+":"+strconv.FormatUint(m.Line, 10)+":"+m.Content)
		}
		return got, out.Truncated
	}
	got, trunc := run(contract.FsGrepRequest{Path: "/", Pattern: "TODO", Recursive: true})
	assert.DeepEqual(t, got, []string{"/a.go:2:// TODO: one", "/nolf.txt:1:TODO at the end", "/sub/b.txt:2:" + strings.Repeat("é", 10) + " TODO long", "/vendor/v.go:1:// TODO vendored"})
	assert.Check(t, !trunc)

	got, _ = run(contract.FsGrepRequest{Path: "/", Pattern: "todo", IgnoreCase: true, Recursive: true, ExcludeGlob: []string{"vendor/", "*.txt"}})
	assert.DeepEqual(t, got, []string{"/a.go:2:// TODO: one"})
	got, _ = run(contract.FsGrepRequest{Path: "/", Pattern: "TODO", Recursive: true, IncludeGlob: []string{"**/*.go"}, ExcludeGlob: []string{"/vendor"}})
	assert.DeepEqual(t, got, []string{"/a.go:2:// TODO: one"})
	got, _ = run(contract.FsGrepRequest{Path: "/", Pattern: "TODO", Recursive: false})
	assert.DeepEqual(t, got, []string{"/a.go:2:// TODO: one", "/nolf.txt:1:TODO at the end"})
	got, _ = run(contract.FsGrepRequest{Path: "/sub/b.txt", Pattern: "TODO", MaxLineBytes: 5})
	// Cut on a UTF-8 boundary: 5 bytes hold two é.
	assert.DeepEqual(t, got, []string{"/sub/b.txt:2:éé…"})
	got, trunc = run(contract.FsGrepRequest{Path: "/", Pattern: "TODO", Recursive: true, MaxMatches: 2})
	assert.Equal(t, len(got), 2)
	assert.Check(t, trunc)
	got, trunc = run(contract.FsGrepRequest{Path: "/", Pattern: "TODO", Recursive: true, MaxMatches: 4})
	assert.Equal(t, len(got), 4)
	assert.Check(t, !trunc, "exactly max_matches matches is not truncated")
}

func TestSed(t *testing.T) {
	tr, dir := newTree(t,
		fs.WithFile("a.txt", "foo foo\r\nbar foo\n", fs.WithMode(0o640)),
		fs.WithFile("b.go", "foo()\n"),
		fs.WithFile("bin", "foo\x00"),
		fs.WithDir("sub", fs.WithFile("c.txt", "nothing\n")),
	)
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		assert.NilError(t, err)
		return string(b)
	}
	out, err := tr.Sed(ctx, &contract.FsSedRequest{Path: "/", Recursive: true, Pattern: "f(o+)", Replacement: "${1}x", Regex: true, ExcludeGlob: []string{"*.go"}})
	assert.NilError(t, err)
	assert.DeepEqual(t, out, &contract.FsSedResponse{
		Results:           []contract.SedResult{{Path: "/a.txt", Replacements: 3, Success: true}},
		TotalReplacements: 3,
	})
	assert.Equal(t, read("a.txt"), "oox oox\r\nbar oox\n")
	st, _ := os.Stat(filepath.Join(dir, "a.txt"))
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o640))
	assert.Equal(t, read("bin"), "foo\x00", "binary files are skipped when walking")

	out, err = tr.Sed(ctx, &contract.FsSedRequest{Files: []string{"/b.go", "/missing", "/sub"}, Pattern: "(", Replacement: "$1[", Regex: false, FirstOnly: true})
	assert.NilError(t, err)
	assert.Equal(t, out.TotalReplacements, uint64(1))
	assert.Equal(t, len(out.Results), 3)
	assert.Check(t, out.Results[0].Success)
	assert.Check(t, !out.Results[1].Success && strings.HasPrefix(out.Results[1].Error, "S211"))
	assert.Check(t, !out.Results[2].Success && strings.HasPrefix(out.Results[2].Error, "S212"))
	assert.Equal(t, read("b.go"), "foo$1[)\n")

	out, err = tr.Sed(ctx, &contract.FsSedRequest{Path: "/a.txt", Pattern: "^OOX", Replacement: "", Regex: true, IgnoreCase: true})
	assert.NilError(t, err)
	assert.Equal(t, out.TotalReplacements, uint64(1), "^ anchors at the file's start")
	assert.Equal(t, read("a.txt"), " oox\r\nbar oox\n")
	out, err = tr.Sed(ctx, &contract.FsSedRequest{Path: "/a.txt", Pattern: "(?m)oox$", Replacement: "end", Regex: true})
	assert.NilError(t, err)
	assert.Equal(t, out.TotalReplacements, uint64(1), "(?m)$ anchors before a newline, not before \\r")
	assert.Equal(t, read("a.txt"), " oox\r\nbar end\n")

	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		assert.Check(t, !strings.Contains(e.Name(), ".iii-"), "temporary file left behind: %s", e.Name())
	}
	_, err = tr.Sed(ctx, &contract.FsSedRequest{Path: "/", Pattern: "[", Regex: true})
	assert.Equal(t, codeOf(t, err), contract.S217)
	_, err = tr.Sed(ctx, &contract.FsSedRequest{Path: "/nowhere", Pattern: "x"})
	assert.Equal(t, codeOf(t, err), contract.S211)
}

func TestReadLine(t *testing.T) {
	long := strings.Repeat("z", textscan.MaxLine+500)
	tr, _ := newTree(t, fs.WithFile("f", "a\n"+long+"\nb"))
	out, err := tr.Grep(ctx, &contract.FsGrepRequest{Path: "/f", Pattern: "^(a|b|z+)$", MaxMatches: 10, MaxLineBytes: 3})
	assert.NilError(t, err)
	assert.Equal(t, len(out.Matches), 3)
	assert.DeepEqual(t, []uint64{out.Matches[0].Line, out.Matches[1].Line, out.Matches[2].Line}, []uint64{1, 2, 3})
	assert.Check(t, is.Equal(out.Matches[1].Content, "zzz…"))
}
