//go:build linux

package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/fs"

	"github.com/iii-sandbox/iii/internal/textscan"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

func ptr[T any](v T) *T { return &v }

// codeOf returns the agent error code of err, or "" for nil.
func codeOf(t *testing.T, err error) string {
	t.Helper()
	if err == nil {
		return ""
	}
	var ae *agentproto.Error
	assert.Assert(t, errors.As(err, &ae), "not an agent error: %v", err)
	return ae.Code
}

func newTree(t *testing.T) (*FS, string) {
	t.Helper()
	dir := fs.NewDir(t, "guestfs",
		fs.WithFile("file.txt", "hello\nworld\n", fs.WithMode(0o644)),
		fs.WithDir("dir",
			fs.WithFile("a.py", "import os\nprint('x')\n"),
			fs.WithFile("b.txt", "nothing\n"),
			fs.WithDir("sub", fs.WithFile("c.py", "print('deep')\n")),
		),
		fs.WithDir("empty"),
	)
	return &FS{Root: dir.Path()}, dir.Path()
}

func TestFSLsStat(t *testing.T) {
	f, root := newTree(t)
	assert.NilError(t, os.Symlink("file.txt", filepath.Join(root, "link")))

	ls, err := f.Ls(&agentproto.FSRequest{Path: "/"})
	assert.NilError(t, err)
	var names []string
	for _, e := range ls.Entries {
		names = append(names, e.Name)
	}
	assert.DeepEqual(t, names, []string{"dir", "empty", "file.txt", "link"})
	assert.Equal(t, ls.Entries[2].Mode, "0644")
	assert.Equal(t, ls.Entries[2].Size, int64(12))
	assert.Assert(t, ls.Entries[3].IsSymlink)
	assert.Assert(t, ls.Entries[0].IsDir)

	st, err := f.Stat(&agentproto.FSRequest{Path: "/link"})
	assert.NilError(t, err)
	assert.Assert(t, st.IsSymlink && !st.IsDir)
	assert.Equal(t, st.Name, "link")

	st, err = f.Stat(&agentproto.FSRequest{Path: "dir/../file.txt"})
	assert.NilError(t, err)
	assert.Equal(t, st.Name, "file.txt")

	assert.NilError(t, syscall.Chmod(filepath.Join(root, "empty"), 0o1777))
	st, err = f.Stat(&agentproto.FSRequest{Path: "/empty"})
	assert.NilError(t, err)
	assert.Equal(t, st.Mode, "1777")
}

// TestFSErrorCodes triggers every S21x code the agent produces.
func TestFSErrorCodes(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		setup  func(t *testing.T, root string)
		run    func(f *FS) error
		code   string
		parent bool
	}{
		{"S210 sed with files and path", nil, func(f *FS) error {
			_, err := f.Sed(ctx, &agentproto.FSRequest{Files: []string{"/file.txt"}, Path: "/", Pattern: "x", Replacement: ptr("")})
			return err
		}, agentproto.CodeFSInvalid, false},
		{"S210 sed with neither", nil, func(f *FS) error {
			_, err := f.Sed(ctx, &agentproto.FSRequest{Pattern: "x", Replacement: ptr("")})
			return err
		}, agentproto.CodeFSInvalid, false},
		{"S210 sed without replacement", nil, func(f *FS) error {
			_, err := f.Sed(ctx, &agentproto.FSRequest{Path: "/", Pattern: "x"})
			return err
		}, agentproto.CodeFSInvalid, false},
		{"S210 bad mode", nil, func(f *FS) error {
			_, err := f.Mkdir(&agentproto.FSRequest{Path: "/m", Mode: "rwx"})
			return err
		}, agentproto.CodeFSInvalid, false},
		{"S210 chmod without mode", nil, func(f *FS) error {
			_, err := f.Chmod(ctx, &agentproto.FSRequest{Path: "/file.txt"})
			return err
		}, agentproto.CodeFSInvalid, false},
		{"S210 empty path", nil, func(f *FS) error {
			_, err := f.Stat(&agentproto.FSRequest{})
			return err
		}, agentproto.CodeFSInvalid, false},
		{"S210 bad glob", nil, func(f *FS) error {
			_, err := f.Grep(ctx, &agentproto.FSRequest{Path: "/", Pattern: "x", IncludeGlob: []string{"["}})
			return err
		}, agentproto.CodeFSInvalid, false},
		{"S210 rm root", nil, func(f *FS) error {
			_, err := f.Rm(&agentproto.FSRequest{Path: "/", Recursive: ptr(true)})
			return err
		}, agentproto.CodeFSInvalid, false},
		{"S210 mv into itself", nil, func(f *FS) error {
			_, err := f.Mv(&agentproto.FSRequest{Src: "/dir", Dst: "/dir/sub/x"})
			return err
		}, agentproto.CodeFSInvalid, false},
		{"S211 stat missing", nil, func(f *FS) error {
			_, err := f.Stat(&agentproto.FSRequest{Path: "/nope"})
			return err
		}, agentproto.CodeFSNotFound, false},
		{"S211 read missing", nil, func(f *FS) error {
			_, _, err := f.OpenRead(&agentproto.FSRequest{Path: "/nope"})
			return err
		}, agentproto.CodeFSNotFound, false},
		{"S211 mkdir parent missing", nil, func(f *FS) error {
			_, err := f.Mkdir(&agentproto.FSRequest{Path: "/a/b/c"})
			return err
		}, agentproto.CodeFSNotFound, true},
		{"S211 write parent missing", nil, func(f *FS) error {
			_, err := f.Write(ctx, &agentproto.FSRequest{Path: "/a/b/c.txt"}, strings.NewReader("x"))
			return err
		}, agentproto.CodeFSNotFound, true},
		{"S211 mv dst parent missing is not fixable", nil, func(f *FS) error {
			_, err := f.Mv(&agentproto.FSRequest{Src: "/file.txt", Dst: "/a/b"})
			return err
		}, agentproto.CodeFSNotFound, false},
		{"S211 grep missing", nil, func(f *FS) error {
			_, err := f.Grep(ctx, &agentproto.FSRequest{Path: "/nope", Pattern: "x"})
			return err
		}, agentproto.CodeFSNotFound, false},
		{"S211 rm missing", nil, func(f *FS) error {
			_, err := f.Rm(&agentproto.FSRequest{Path: "/nope"})
			return err
		}, agentproto.CodeFSNotFound, false},
		{"S212 ls a file", nil, func(f *FS) error {
			_, err := f.Ls(&agentproto.FSRequest{Path: "/file.txt"})
			return err
		}, agentproto.CodeFSWrongType, false},
		{"S212 read a directory", nil, func(f *FS) error {
			_, _, err := f.OpenRead(&agentproto.FSRequest{Path: "/dir"})
			return err
		}, agentproto.CodeFSWrongType, false},
		{"S212 write over a directory", nil, func(f *FS) error {
			_, err := f.Write(ctx, &agentproto.FSRequest{Path: "/dir"}, strings.NewReader("x"))
			return err
		}, agentproto.CodeFSWrongType, false},
		{"S212 parent is a file", nil, func(f *FS) error {
			_, err := f.Mkdir(&agentproto.FSRequest{Path: "/file.txt/x"})
			return err
		}, agentproto.CodeFSWrongType, false},
		{"S212 stat through a file", nil, func(f *FS) error {
			_, err := f.Stat(&agentproto.FSRequest{Path: "/file.txt/x"})
			return err
		}, agentproto.CodeFSWrongType, false},
		{"S212 mv file over dir", nil, func(f *FS) error {
			_, err := f.Mv(&agentproto.FSRequest{Src: "/file.txt", Dst: "/empty", Overwrite: true})
			return err
		}, agentproto.CodeFSWrongType, false},
		{"S213 mkdir exists", nil, func(f *FS) error {
			_, err := f.Mkdir(&agentproto.FSRequest{Path: "/dir"})
			return err
		}, agentproto.CodeFSExists, false},
		{"S212 mkdir -p over a file", nil, func(f *FS) error {
			_, err := f.Mkdir(&agentproto.FSRequest{Path: "/file.txt", Parents: true})
			return err
		}, agentproto.CodeFSWrongType, false},
		{"S213 mv without overwrite", nil, func(f *FS) error {
			_, err := f.Mv(&agentproto.FSRequest{Src: "/file.txt", Dst: "/dir/b.txt"})
			return err
		}, agentproto.CodeFSExists, false},
		{"S214 rm non-empty dir", nil, func(f *FS) error {
			_, err := f.Rm(&agentproto.FSRequest{Path: "/dir"})
			return err
		}, agentproto.CodeFSNotEmpty, false},
		{"S214 mv dir onto non-empty dir", nil, func(f *FS) error {
			_, err := f.Mv(&agentproto.FSRequest{Src: "/empty", Dst: "/dir", Overwrite: true})
			return err
		}, agentproto.CodeFSNotEmpty, false},
		{"S216 symlink loop", func(t *testing.T, root string) {
			assert.NilError(t, os.Symlink("loop2", filepath.Join(root, "loop1")))
			assert.NilError(t, os.Symlink("loop1", filepath.Join(root, "loop2")))
		}, func(f *FS) error {
			_, _, err := f.OpenRead(&agentproto.FSRequest{Path: "/loop1"})
			return err
		}, agentproto.CodeFSIO, false},
		{"S217 grep bad regex", nil, func(f *FS) error {
			_, err := f.Grep(ctx, &agentproto.FSRequest{Path: "/", Pattern: "(unclosed"})
			return err
		}, agentproto.CodeFSRegex, false},
		{"S217 sed bad regex", nil, func(f *FS) error {
			_, err := f.Sed(ctx, &agentproto.FSRequest{Path: "/", Pattern: "a{2,1}", Replacement: ptr("")})
			return err
		}, agentproto.CodeFSRegex, false},
		{"S218 write stream cut", nil, func(f *FS) error {
			_, err := f.Write(ctx, &agentproto.FSRequest{Path: "/cut.txt"}, io.MultiReader(strings.NewReader("partial"), errReader{io.ErrClosedPipe}))
			return err
		}, agentproto.CodeFSAborted, false},
		{"S219 unknown op", nil, func(f *FS) error {
			_, err := f.Do(ctx, &agentproto.FSRequest{Op: "frobnicate", Path: "/"})
			return err
		}, agentproto.CodeFSUnsupported, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, root := newTree(t)
			if tc.setup != nil {
				tc.setup(t, root)
			}
			err := tc.run(f)
			assert.Equal(t, codeOf(t, err), tc.code, "error: %v", err)
			var ae *agentproto.Error
			assert.Assert(t, errors.As(err, &ae))
			assert.Equal(t, ae.ParentMissing, tc.parent)
			assert.Assert(t, !strings.Contains(ae.Message, root), "message leaks the host root: %s", ae.Message)
		})
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestFSPermissionDenied produces a real S215. Root bypasses permission
// checks, so as root the operation runs in a child process (this test
// binary) with the uid of nobody.
func TestFSPermissionDenied(t *testing.T) {
	dir, err := os.MkdirTemp("", "guestfs-perm")
	assert.NilError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	assert.NilError(t, os.Chmod(dir, 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o600))
	assert.NilError(t, os.Mkdir(filepath.Join(dir, "locked"), 0o755))

	if os.Geteuid() != 0 {
		assert.NilError(t, os.Chmod(filepath.Join(dir, "secret"), 0))
		f := &FS{Root: dir}
		_, _, err := f.OpenRead(&agentproto.FSRequest{Path: "/secret"})
		assert.Equal(t, codeOf(t, err), agentproto.CodeFSPermission)
		return
	}
	// The test binary's own directory is private to root: run a copy.
	self := filepath.Join(dir, "guest.test")
	bin, err := os.ReadFile(os.Args[0])
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(self, bin, 0o755))
	for _, op := range []string{"read", "write", "mkdir", "rm"} {
		t.Run(op, func(t *testing.T) {
			cmd := exec.Command(self, "-test.run=^$")
			cmd.Env = append(os.Environ(), "GUEST_TEST_HELPER=fsperm", "GUEST_TEST_ROOT="+dir, "GUEST_TEST_OP="+op)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			out, err := cmd.CombinedOutput()
			assert.NilError(t, err, string(out))
			assert.Equal(t, strings.TrimSpace(string(out)), agentproto.CodeFSPermission)
		})
	}
}

// fsPermHelper runs in the child process of TestFSPermissionDenied.
func fsPermHelper() {
	f := &FS{Root: os.Getenv("GUEST_TEST_ROOT")}
	var err error
	switch os.Getenv("GUEST_TEST_OP") {
	case "read":
		_, _, err = f.OpenRead(&agentproto.FSRequest{Path: "/secret"})
	case "write":
		_, err = f.Write(context.Background(), &agentproto.FSRequest{Path: "/locked/new"}, strings.NewReader("x"))
	case "mkdir":
		_, err = f.Mkdir(&agentproto.FSRequest{Path: "/locked/d"})
	case "rm":
		_, err = f.Rm(&agentproto.FSRequest{Path: "/secret"})
	}
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		fmt.Println(ae.Code)
		return
	}
	fmt.Println("unexpected:", err)
}

func TestFSMkdir(t *testing.T) {
	f, root := newTree(t)
	res, err := f.Mkdir(&agentproto.FSRequest{Path: "/x/y/z", Parents: true, Mode: "0700"})
	assert.NilError(t, err)
	assert.Assert(t, res.Created)
	fi, err := os.Stat(filepath.Join(root, "x/y/z"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o700))

	res, err = f.Mkdir(&agentproto.FSRequest{Path: "/x/y/z", Parents: true})
	assert.NilError(t, err)
	assert.Assert(t, !res.Created)

	res, err = f.Mkdir(&agentproto.FSRequest{Path: "/empty/new"})
	assert.NilError(t, err)
	assert.Assert(t, res.Created)
	fi, err = os.Stat(filepath.Join(root, "empty/new"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o755))
}

func TestFSWriteAtomicAndMode(t *testing.T) {
	f, root := newTree(t)
	res, err := f.Write(context.Background(), &agentproto.FSRequest{Path: "/new/dir/f.sh", Mode: "0750", Parents: true}, strings.NewReader("#!/bin/sh\n"))
	assert.NilError(t, err)
	assert.DeepEqual(t, res, &agentproto.WriteResult{BytesWritten: 10, Path: "/new/dir/f.sh"})
	fi, err := os.Stat(filepath.Join(root, "new/dir/f.sh"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o750))

	// A failed write leaves the old content and no temporary file.
	_, err = f.Write(context.Background(), &agentproto.FSRequest{Path: "/file.txt"}, io.MultiReader(strings.NewReader("junk"), errReader{io.ErrUnexpectedEOF}))
	assert.Equal(t, codeOf(t, err), agentproto.CodeFSAborted)
	b, err := os.ReadFile(filepath.Join(root, "file.txt"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "hello\nworld\n")
	des, err := os.ReadDir(root)
	assert.NilError(t, err)
	for _, de := range des {
		assert.Assert(t, !strings.Contains(de.Name(), ".iii-"), "temporary file left: %s", de.Name())
	}

	// A canceled context aborts too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = f.Write(ctx, &agentproto.FSRequest{Path: "/c.txt"}, strings.NewReader("x"))
	assert.Equal(t, codeOf(t, err), agentproto.CodeFSAborted)
}

func TestFSRead(t *testing.T) {
	f, _ := newTree(t)
	meta, file, err := f.OpenRead(&agentproto.FSRequest{Path: "/file.txt"})
	assert.NilError(t, err)
	defer file.Close()
	assert.Equal(t, meta.Size, int64(12))
	assert.Equal(t, meta.Mode, "0644")
	b, err := io.ReadAll(file)
	assert.NilError(t, err)
	assert.Equal(t, string(b), "hello\nworld\n")
}

func TestFSRmChmodMv(t *testing.T) {
	ctx := context.Background()
	f, root := newTree(t)

	rm, err := f.Rm(&agentproto.FSRequest{Path: "/empty"})
	assert.NilError(t, err)
	assert.Assert(t, rm.Removed)
	_, err = f.Rm(&agentproto.FSRequest{Path: "/dir", Recursive: ptr(true)})
	assert.NilError(t, err)
	_, err = os.Stat(filepath.Join(root, "dir"))
	assert.Assert(t, os.IsNotExist(err))

	assert.NilError(t, os.MkdirAll(filepath.Join(root, "t/u"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(root, "t/u/f"), nil, 0o644))
	assert.NilError(t, os.Symlink("/nonexistent", filepath.Join(root, "t/dangling")))
	ch, err := f.Chmod(ctx, &agentproto.FSRequest{Path: "/t", Mode: "0700", Recursive: ptr(true)})
	assert.NilError(t, err)
	assert.Equal(t, ch.Updated, int64(3)) // t, t/u, t/u/f; the symlink t/dangling is left alone
	fi, err := os.Stat(filepath.Join(root, "t/u/f"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o700))

	ch, err = f.Chmod(ctx, &agentproto.FSRequest{Path: "/file.txt", Mode: "4755", UID: ptr(os.Getuid())})
	assert.NilError(t, err)
	assert.Equal(t, ch.Updated, int64(1))
	st, err := f.Stat(&agentproto.FSRequest{Path: "/file.txt"})
	assert.NilError(t, err)
	assert.Equal(t, st.Mode, "4755")

	mv, err := f.Mv(&agentproto.FSRequest{Src: "/file.txt", Dst: "/t/moved.txt"})
	assert.NilError(t, err)
	assert.Assert(t, mv.Moved)
	assert.NilError(t, os.WriteFile(filepath.Join(root, "other"), []byte("o"), 0o644))
	_, err = f.Mv(&agentproto.FSRequest{Src: "/other", Dst: "/t/moved.txt", Overwrite: true})
	assert.NilError(t, err)
	b, err := os.ReadFile(filepath.Join(root, "t/moved.txt"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "o")
}

// TestFSMvAcrossFilesystems moves a tree between two filesystems: the test
// root and a tmpfs mounted into it (as the VM's overlay root and /tmp are).
func TestFSMvAcrossFilesystems(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	f, root := newTree(t)
	mnt := filepath.Join(root, "mnt")
	assert.NilError(t, os.Mkdir(mnt, 0o755))
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("cannot mount tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	assert.NilError(t, os.Symlink("a.py", filepath.Join(root, "dir/link")))
	assert.NilError(t, os.Chmod(filepath.Join(root, "dir/a.py"), 0o751))

	_, err := f.Mv(&agentproto.FSRequest{Src: "/dir", Dst: "/mnt/dir"})
	assert.NilError(t, err)
	_, err = os.Stat(filepath.Join(root, "dir"))
	assert.Assert(t, os.IsNotExist(err))
	b, err := os.ReadFile(filepath.Join(mnt, "dir/sub/c.py"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "print('deep')\n")
	target, err := os.Readlink(filepath.Join(mnt, "dir/link"))
	assert.NilError(t, err)
	assert.Equal(t, target, "a.py")
	fi, err := os.Stat(filepath.Join(mnt, "dir/a.py"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o751))
}

func TestFSGrep(t *testing.T) {
	ctx := context.Background()
	f, root := newTree(t)
	assert.NilError(t, os.WriteFile(filepath.Join(root, "dir/bin.dat"), []byte("print\x00binary"), 0o644))
	long := strings.Repeat("é", 3000) + " print"
	assert.NilError(t, os.WriteFile(filepath.Join(root, "long.txt"), []byte(long+"\r\nno newline print"), 0o644))

	tests := []struct {
		name      string
		req       agentproto.FSRequest
		want      []string // path:line
		truncated bool
	}{
		{"recursive default", agentproto.FSRequest{Path: "/dir", Pattern: "print"},
			[]string{"/dir/a.py:2", "/dir/sub/c.py:1"}, false},
		{"not recursive", agentproto.FSRequest{Path: "/dir", Pattern: "print", Recursive: ptr(false)},
			[]string{"/dir/a.py:2"}, false},
		{"include glob", agentproto.FSRequest{Path: "/", Pattern: "o", IncludeGlob: []string{"*.txt"}},
			[]string{"/dir/b.txt:1", "/file.txt:1", "/file.txt:2", "/long.txt:2"}, false},
		{"exclude dir", agentproto.FSRequest{Path: "/dir", Pattern: "print", ExcludeGlob: []string{"sub/"}},
			[]string{"/dir/a.py:2"}, false},
		{"ignore case", agentproto.FSRequest{Path: "/file.txt", Pattern: "HELLO", IgnoreCase: true},
			[]string{"/file.txt:1"}, false},
		{"max matches", agentproto.FSRequest{Path: "/file.txt", Pattern: "o", MaxMatches: 1},
			[]string{"/file.txt:1"}, true},
		{"long lines and no final newline", agentproto.FSRequest{Path: "/long.txt", Pattern: "print"},
			[]string{"/long.txt:1", "/long.txt:2"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := f.Grep(ctx, &tc.req)
			assert.NilError(t, err)
			var got []string
			for _, m := range res.Matches {
				got = append(got, fmt.Sprintf("%s:%d", m.Path, m.Line))
			}
			assert.DeepEqual(t, got, tc.want)
			assert.Equal(t, res.Truncated, tc.truncated)
		})
	}

	res, err := f.Grep(ctx, &agentproto.FSRequest{Path: "/long.txt", Pattern: "print", MaxLineBytes: 5})
	assert.NilError(t, err)
	assert.Equal(t, res.Matches[0].Content, "éé…") // cut at a character boundary
	assert.Equal(t, res.Matches[1].Content, "no ne…")

	// An empty result is an empty list, not null.
	res, err = f.Grep(ctx, &agentproto.FSRequest{Path: "/", Pattern: "zzzz"})
	assert.NilError(t, err)
	b, _ := json.Marshal(res)
	assert.Equal(t, string(b), `{"matches":[],"truncated":false}`)
}

func TestFSSed(t *testing.T) {
	ctx := context.Background()
	f, root := newTree(t)
	assert.NilError(t, os.Chmod(filepath.Join(root, "dir/a.py"), 0o751))

	res, err := f.Sed(ctx, &agentproto.FSRequest{Path: "/dir", Pattern: `print\('(\w+)'\)`, Replacement: ptr("log('$1!')"), IncludeGlob: []string{"*.py"}})
	assert.NilError(t, err)
	assert.Equal(t, res.TotalReplacements, 2)
	assert.DeepEqual(t, res.Results, []agentproto.SedFileResult{
		{Path: "/dir/a.py", Replacements: 1, Success: true},
		{Path: "/dir/sub/c.py", Replacements: 1, Success: true},
	})
	b, err := os.ReadFile(filepath.Join(root, "dir/a.py"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "import os\nlog('x!')\n")
	fi, err := os.Stat(filepath.Join(root, "dir/a.py"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o751), "sed keeps the mode")

	// Literal mode, first only, a missing file reported per file.
	assert.NilError(t, os.WriteFile(filepath.Join(root, "lit.txt"), []byte("a.b a.b a.b $1"), 0o644))
	res, err = f.Sed(ctx, &agentproto.FSRequest{Files: []string{"/lit.txt", "/missing"}, Pattern: "a.b", Replacement: ptr("$1"), Regex: ptr(false), FirstOnly: true})
	assert.NilError(t, err)
	assert.Equal(t, res.TotalReplacements, 1)
	assert.Check(t, is.Len(res.Results, 2))
	assert.Assert(t, res.Results[0].Success)
	assert.Assert(t, !res.Results[1].Success)
	assert.Assert(t, res.Results[1].Error == "S211: path not found: /missing", res.Results[1].Error)
	b, err = os.ReadFile(filepath.Join(root, "lit.txt"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "$1 a.b a.b $1")

	// Ignore case, all matches.
	res, err = f.Sed(ctx, &agentproto.FSRequest{Files: []string{"/file.txt"}, Pattern: "O", Replacement: ptr("0"), IgnoreCase: true})
	assert.NilError(t, err)
	assert.Equal(t, res.TotalReplacements, 2)
	b, err = os.ReadFile(filepath.Join(root, "file.txt"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "hell0\nw0rld\n")
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in   string
		want uint32
		ok   bool
	}{
		{"0644", 0o644, true}, {"755", 0o755, true}, {"0o700", 0o700, true}, {"4755", 0o4755, true},
		{"0", 0, true}, {"", 0, true}, {"8", 0, false}, {"07777", 0o7777, true}, {"17777", 0, false},
		{"rwx", 0, false}, {"-1", 0, false}, {"00000644", 0, false},
	}
	for _, tc := range tests {
		got, err := ParseMode(tc.in)
		assert.Equal(t, err == nil, tc.ok, "mode %q: %v", tc.in, err)
		if tc.ok {
			assert.Equal(t, got, tc.want, "mode %q", tc.in)
		}
	}
}

func TestCutLine(t *testing.T) {
	assert.Equal(t, textscan.CutLine([]byte("abc"), 3), "abc")
	assert.Equal(t, textscan.CutLine([]byte("abcd"), 3), "abc…")
	assert.Equal(t, textscan.CutLine([]byte("日本語"), 4), "日…")
	assert.Equal(t, textscan.CutLine([]byte("日本語"), 0), "…")
	assert.Assert(t, bytes.Equal([]byte(textscan.CutLine([]byte{0xff, 0xfe}, 1)), []byte("\xff…")))
}

func FuzzParseMode(f *testing.F) {
	f.Add("0644")
	f.Add("0o7777")
	f.Fuzz(func(t *testing.T, s string) {
		if v, err := ParseMode(s); err == nil && v > 0o7777 {
			t.Fatalf("mode %o out of range", v)
		}
	})
}
