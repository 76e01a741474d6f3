package sandboxfs

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/fs"
)

// trees serves the same fresh directory through both FS implementations.
func trees(t *testing.T, ops ...fs.PathOp) (map[string]*Tree, string) {
	t.Helper()
	dir := fs.NewDir(t, "sandboxfs", ops...)
	root, err := os.OpenRoot(dir.Path())
	assert.NilError(t, err)
	t.Cleanup(func() { root.Close() })
	return map[string]*Tree{"root": NewTree(root, "/"), "dir": NewTree(Dir(dir.Path()), "/")}, dir.Path()
}

func kindOf(t *testing.T, err error) Kind {
	t.Helper()
	var e *Error
	assert.Assert(t, errors.As(err, &e), "want *Error, got %v", err)
	return e.Kind
}

func TestReplace(t *testing.T) {
	tests := []struct {
		name, pattern, in, repl string
		expand, first           bool
		want                    string
		n                       uint64
	}{
		{"whole content: ^ is the file's start", "^a", "a\na\n", "b", true, false, "b\na\n", 1},
		{"(?m) anchors at lines", "(?m)^a$", "a\r\na\n", "b", true, false, "a\r\nb\n", 1},
		{"spans lines", "x\ny", "x\ny\n", "-", true, false, "-\n", 1},
		{"expand groups", "f(o+)", "foo fo", "${1}!", true, false, "oo! o!", 2},
		{"literal replacement", "f(o+)", "foo", "$1", false, false, "$1", 1},
		{"first only", "o", "ooo", "0", true, true, "0oo", 1},
		{"empty matches", "a*", "bab", "-", true, false, "-b-b-", 3},
		{"no match", "z", "abc", "-", true, false, "abc", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, n := Replace([]byte(tc.in), regexp.MustCompile(tc.pattern), []byte(tc.repl), tc.expand, tc.first)
			assert.Equal(t, string(out), tc.want)
			assert.Equal(t, n, tc.n)
		})
	}
}

func TestFromOS(t *testing.T) {
	tests := []struct {
		err  error
		kind Kind
		msg  string
	}{
		{&os.PathError{Op: "open", Path: "/host/x", Err: syscall.ENOENT}, KindNotFound, "path not found: /x"},
		{&os.PathError{Op: "rmdir", Path: "/host/x", Err: syscall.ENOTEMPTY}, KindNotEmpty, "directory not empty: /x"},
		{&os.PathError{Op: "open", Path: "/host/x", Err: syscall.ENOTDIR}, KindWrongType, "not a directory: /x, or one of its parents, is a file"},
		{&os.PathError{Op: "open", Path: "/host/x", Err: syscall.EEXIST}, KindExists, "path already exists: /x"},
		{&os.PathError{Op: "open", Path: "/host/x", Err: syscall.EACCES}, KindPermission, "permission denied: /x"},
		{&os.PathError{Op: "open", Path: "/host/x", Err: syscall.EROFS}, KindPermission, "permission denied: /x is on a read-only filesystem"},
		{&os.PathError{Op: "open", Path: "/host/x", Err: syscall.ENAMETOOLONG}, KindIO, "/x: file name too long"},
		{errors.New("odd"), KindIO, "/x: odd"},
	}
	for _, tc := range tests {
		err := FromOS("/x", tc.err)
		assert.Equal(t, kindOf(t, err), tc.kind, "%v", tc.err)
		assert.Equal(t, err.Error(), tc.msg)
		assert.Check(t, !strings.Contains(err.Error(), "/host"))
	}
	assert.Equal(t, FromOS("/x", context.Canceled), context.Canceled)
	assert.NilError(t, FromOS("/x", nil))
}

// TestBoundaries shows the one difference between the two FS
// implementations: os.Root keeps a symbolic link out of the sandbox from
// leading anywhere, Dir follows it.
func TestBoundaries(t *testing.T) {
	outside := fs.NewDir(t, "outside", fs.WithFile("secret", "s"))
	ts, dir := trees(t, fs.WithFile("in.txt", "in"))
	assert.NilError(t, os.Symlink(outside.Path(), filepath.Join(dir, "out")))
	assert.NilError(t, os.Symlink("in.txt", filepath.Join(dir, "rel")))
	ctx := context.Background()
	for name, tr := range ts {
		_, f, err := tr.Read(ctx, "/rel")
		assert.NilError(t, err, name)
		b, _ := io.ReadAll(f)
		f.Close()
		assert.Equal(t, string(b), "in", name)
		_, f, err = tr.Read(ctx, "/out/secret")
		if name == "root" {
			assert.Equal(t, kindOf(t, err), KindPermission)
		} else {
			assert.NilError(t, err)
			f.Close()
		}
	}
}

func TestSameAnswersOnBothFS(t *testing.T) {
	ctx := context.Background()
	ts, _ := trees(t, fs.WithFile("file", "x"), fs.WithDir("d", fs.WithFile("f", "")))
	for name, tr := range ts {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, kindOf(t, tr.Rm(ctx, "/", true)), KindInvalid)
			_, err := tr.Mkdir(ctx, "/file", 0o755, true)
			assert.Equal(t, kindOf(t, err), KindWrongType)
			_, err = tr.Mkdir(ctx, "/file/a/b", 0o755, true)
			assert.Equal(t, kindOf(t, err), KindWrongType)
			_, err = tr.Mkdir(ctx, "/d", 0o755, false)
			assert.Equal(t, kindOf(t, err), KindExists)
			_, err = tr.Mkdir(ctx, "/no/d", 0o755, false)
			var e *Error
			assert.Assert(t, errors.As(err, &e) && e.Kind == KindNotFound && e.ParentMissing)
			assert.Equal(t, kindOf(t, tr.Mv(ctx, "/file", "/d", true)), KindWrongType)
			assert.Equal(t, kindOf(t, tr.Mv(ctx, "/d", "/file", true)), KindWrongType)
			assert.Equal(t, kindOf(t, tr.Mv(ctx, "/d", "/d/in", false)), KindInvalid)
			_, _, err = tr.Write(ctx, "", 0o644, false, nil)
			assert.Equal(t, kindOf(t, err), KindInvalid)
			_, _, err = tr.Write(ctx, "/a\x00b", 0o644, false, nil)
			assert.Equal(t, kindOf(t, err), KindInvalid)
			// A reader that fails is an aborted write carrying its error.
			boom := errors.New("boom")
			_, _, err = tr.Write(ctx, "/w", 0o644, false, io.MultiReader(strings.NewReader("x"), iotestErr{boom}))
			assert.Equal(t, kindOf(t, err), KindAborted)
			assert.Assert(t, errors.Is(err, boom))
			_, err = tr.Stat(ctx, "/w")
			assert.Equal(t, kindOf(t, err), KindNotFound, "a failed write leaves nothing behind")
		})
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// TestMoveAcross drives the cross-filesystem copy directly: a test cannot
// count on two filesystems, and rename would not call it otherwise.
func TestMoveAcross(t *testing.T) {
	ts, dir := trees(t, fs.WithDir("src", fs.WithMode(0o750),
		fs.WithFile("f", "data", fs.WithMode(0o640)),
		fs.WithDir("sub", fs.WithFile("g", "g"))),
		fs.WithDir("emptydst"))
	tr := ts["root"]
	assert.NilError(t, os.Symlink("f", filepath.Join(dir, "src/l")))
	st, err := os.Lstat(filepath.Join(dir, "src"))
	assert.NilError(t, err)
	assert.NilError(t, tr.moveAcross("src", "emptydst", st))
	_, err = os.Stat(filepath.Join(dir, "src"))
	assert.Check(t, os.IsNotExist(err))
	b, err := os.ReadFile(filepath.Join(dir, "emptydst/f"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "data")
	fi, err := os.Stat(filepath.Join(dir, "emptydst/f"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o640))
	fi, err = os.Stat(filepath.Join(dir, "emptydst"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o750))
	target, err := os.Readlink(filepath.Join(dir, "emptydst/l"))
	assert.NilError(t, err)
	assert.Equal(t, target, "f")
	b, err = os.ReadFile(filepath.Join(dir, "emptydst/sub/g"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "g")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		assert.Check(t, !strings.Contains(e.Name(), ".iii-"), "temporary left behind: %s", e.Name())
	}
}

func TestSedKeepsModeAndSkipsUnchanged(t *testing.T) {
	ctx := context.Background()
	ts, dir := trees(t)
	for name, tr := range ts {
		t.Run(name, func(t *testing.T) {
			d := filepath.Join(dir, name)
			assert.NilError(t, os.MkdirAll(filepath.Join(d, "a"), 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(d, "a.txt"), []byte("x"), 0o600))
			assert.NilError(t, os.Chmod(filepath.Join(d, "a.txt"), FileMode(0o4750)))
			assert.NilError(t, os.WriteFile(filepath.Join(d, "a/b.txt"), []byte("x"), 0o644))
			assert.NilError(t, os.WriteFile(filepath.Join(d, "same.txt"), []byte("y"), 0o644))
			before, err := os.Stat(filepath.Join(d, "same.txt"))
			assert.NilError(t, err)
			res, total, err := tr.Sed(ctx, &SedRequest{Path: "/" + name, Recursive: true, Pattern: "x", Replacement: "z", Regex: true})
			assert.NilError(t, err)
			assert.Equal(t, total, uint64(2))
			assert.DeepEqual(t, res, []SedResult{{Path: "/" + name + "/a.txt", Replacements: 1}, {Path: "/" + name + "/a/b.txt", Replacements: 1}})
			fi, err := os.Stat(filepath.Join(d, "a.txt"))
			assert.NilError(t, err)
			assert.Equal(t, UnixMode(fi.Mode()), uint32(0o4750))
			after, err := os.Stat(filepath.Join(d, "same.txt"))
			assert.NilError(t, err)
			assert.Check(t, os.SameFile(before, after), "an unchanged file is not rewritten")
		})
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
