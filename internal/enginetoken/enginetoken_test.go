package enginetoken

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestPathFollowsHome(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	p, err := Path()
	assert.NilError(t, err)
	assert.Equal(t, p, filepath.Join(home, ".iii", "engine-token"))
}

// TestEnsure: the first call makes the file (256 bits, hex, 0600, in a
// 0700 directory); later calls return the same token.
func TestEnsure(t *testing.T) {
	p := filepath.Join(t.TempDir(), ".iii", FileName)
	tok, created, err := Ensure(p)
	assert.NilError(t, err)
	assert.Check(t, created)
	assert.Check(t, regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(tok), tok)
	st, err := os.Stat(p)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
	dst, err := os.Stat(filepath.Dir(p))
	assert.NilError(t, err)
	assert.Equal(t, dst.Mode().Perm(), os.FileMode(0o700))
	data, err := os.ReadFile(p)
	assert.NilError(t, err)
	assert.Equal(t, string(data), tok+"\n")

	again, created, err := Ensure(p)
	assert.NilError(t, err)
	assert.Check(t, !created)
	assert.Equal(t, again, tok)
}

// TestEnsureConcurrent: engines starting at once agree on one token.
func TestEnsureConcurrent(t *testing.T) {
	p := filepath.Join(t.TempDir(), ".iii", FileName)
	const n = 12
	toks := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, _, err := Ensure(p)
			assert.Check(t, err)
			toks[i] = tok
		}()
	}
	waitfor.Group(t, &wg, waitfor.Default, "the concurrent Ensure calls")
	for _, tok := range toks {
		assert.Equal(t, tok, toks[0])
	}
}

// TestReadRefuses: a file others may read or write, a symbolic link, an
// empty file or one with two lines is refused with a message that says
// how to fix it; a missing file is fs.ErrNotExist.
func TestReadRefuses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.WriteFile(p, []byte(content), mode))
		assert.NilError(t, os.Chmod(p, mode))
		return p
	}
	_, err := Read(filepath.Join(dir, "missing"))
	assert.Check(t, errors.Is(err, fs.ErrNotExist), "%v", err)

	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"group-readable", "tok\n", 0o640, "has mode 0640: other users may read it"},
		{"world-readable", "tok\n", 0o644, "chmod 600"},
		{"world-writable", "tok\n", 0o602, "has mode 0602: other users may change it"},
		{"empty", "", 0o600, "it is empty"},
		{"two-lines", "a\nb\n", 0o600, "whitespace or a control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(write(tc.name, tc.content, tc.mode))
			assert.Check(t, is.ErrorContains(err, tc.want))
		})
	}

	good := write("good", "s3cret\n", 0o600)
	tok, err := Read(good)
	assert.NilError(t, err)
	assert.Equal(t, tok, "s3cret")
	link := filepath.Join(dir, "link")
	assert.NilError(t, os.Symlink(good, link))
	_, err = Read(link)
	assert.Check(t, is.ErrorContains(err, "is a symbolic link"))
}

// TestReadRefusesAnotherOwner: a token file another user owns is refused
// even with mode 0600 (it needs root to hand the file to another uid).
func TestReadRefusesAnotherOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give a file to another uid")
	}
	p := filepath.Join(t.TempDir(), FileName)
	assert.NilError(t, os.WriteFile(p, []byte("tok\n"), 0o600))
	assert.NilError(t, os.Chown(p, 65534, 65534))
	_, err := Read(p)
	assert.Check(t, is.ErrorContains(err, "is owned by uid 65534, not by this user (uid 0)"))
	_, _, err = Ensure(p)
	assert.Check(t, is.ErrorContains(err, "owned by uid 65534"), "Ensure does not replace it either")
}

// TestMayReceive: a discovered token goes only to loopback, and not to a
// port another user listens on.
func TestMayReceive(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer l.Close()
	assert.Check(t, MayReceive(l.Addr().String()), "our own listener")
	_, port, _ := net.SplitHostPort(l.Addr().String())
	assert.Check(t, MayReceive("localhost:"+port))
	assert.Check(t, MayReceive("[::1]:"+port))
	assert.Check(t, !MayReceive("192.0.2.1:"+port), "not loopback")
	assert.Check(t, !MayReceive("engine.example:"+port), "a name other than localhost")
	assert.Check(t, !MayReceive("127.0.0.1"), "no port")
}

// TestScanListeners reads the kernel's table format: only LISTEN sockets
// on the port count, and only their owner.
func TestScanListeners(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:C35A 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:C35A 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  2000        0 112 1 0000000000000000 20 4 30 10 -1
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  2000        0 113 1 0000000000000000 100 0 0 10 0
`
	p := filepath.Join(t.TempDir(), "tcp")
	assert.NilError(t, os.WriteFile(p, []byte(table), 0o600))
	scan := func(port uint16, uid int) bool {
		f, err := os.Open(p)
		assert.NilError(t, err)
		defer f.Close()
		return scanListeners(f, port, uid)
	}
	assert.Check(t, !scan(0xC35A, 1000), "uid 1000 listens on 50010; the established socket of 2000 does not count")
	assert.Check(t, scan(0xC35A, 2000))
	assert.Check(t, scan(0x1F90, 1000), "uid 2000 listens on 8080 (any address)")
	assert.Check(t, !scan(0x1F91, 1000), "nobody listens there")
}
