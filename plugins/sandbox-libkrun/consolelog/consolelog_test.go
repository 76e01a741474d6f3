package consolelog

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// onDisk is the bytes the log holds: the rotated file, then the newest.
func onDisk(t *testing.T, path string) (rotated, newest []byte) {
	t.Helper()
	rotated, err := os.ReadFile(path + RotatedSuffix)
	if !os.IsNotExist(err) {
		assert.NilError(t, err)
	}
	newest, err = os.ReadFile(path)
	assert.NilError(t, err)
	return rotated, newest
}

// TestPumpCapsAFastWriter: a writer that writes far more than the cap as
// fast as it can, through a pipe as QEMU does, leaves at most the cap on
// disk, and what is kept is the end of what it wrote, in order.
func TestPumpCapsAFastWriter(t *testing.T) {
	const maxBytes = 64 << 10
	path := filepath.Join(t.TempDir(), "console.log")
	l, err := Create(path, maxBytes)
	assert.NilError(t, err)
	r, w, err := os.Pipe()
	assert.NilError(t, err)
	pumped := make(chan error, 1)
	go func() { pumped <- Pump(r, l) }()

	var all bytes.Buffer
	for i := range 200_000 {
		line := fmt.Sprintf("line %07d of a guest that writes its console in a loop\n", i)
		all.WriteString(line)
		_, err := io.WriteString(w, line)
		assert.NilError(t, err)
	}
	assert.Assert(t, all.Len() > 100*maxBytes)
	assert.NilError(t, w.Close())
	select {
	case err := <-pumped:
		assert.NilError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("Pump did not end within 60 s of the pipe's writer closing")
	}

	rotated, newest := onDisk(t, path)
	assert.Check(t, len(rotated) <= maxBytes/2, "console.log.1 holds %d bytes", len(rotated))
	assert.Check(t, len(newest) <= maxBytes/2, "console.log holds %d bytes", len(newest))
	assert.Check(t, len(rotated)+len(newest) <= maxBytes)
	assert.Check(t, len(rotated) == maxBytes/2, "a rotated file is full")
	kept := append(rotated, newest...)
	assert.Check(t, bytes.HasSuffix(all.Bytes(), kept), "the log is the end of the output, in order")

	tail := Tail(path, 3, 64<<10)
	assert.Check(t, is.Equal(tail, strings.Join([]string{
		"line 0199997 of a guest that writes its console in a loop",
		"line 0199998 of a guest that writes its console in a loop",
		"line 0199999 of a guest that writes its console in a loop",
	}, "\n")))
}

// TestWriteLargerThanTheCap: one write of several caps rotates as often
// as it takes and keeps its end.
func TestWriteLargerThanTheCap(t *testing.T) {
	const maxBytes = MinMaxBytes
	path := filepath.Join(t.TempDir(), "console.log")
	l, err := Create(path, maxBytes)
	assert.NilError(t, err)
	p := make([]byte, 5*maxBytes+123)
	for i := range p {
		p[i] = byte('a' + i%26)
	}
	n, err := l.Write(p)
	assert.NilError(t, err)
	assert.Equal(t, n, len(p))
	assert.NilError(t, l.Close())
	rotated, newest := onDisk(t, path)
	assert.Check(t, len(rotated)+len(newest) <= maxBytes)
	assert.Check(t, bytes.HasSuffix(p, append(rotated, newest...)))
	_, err = l.Write([]byte("x"))
	assert.Check(t, is.ErrorIs(err, os.ErrClosed))
}

// TestTailReadsTheRotatedFile: just after a rotation the newest file holds
// little; the tail comes from both.
func TestTailReadsTheRotatedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	assert.NilError(t, os.WriteFile(path+RotatedSuffix, []byte("one\ntwo\nthree\n"), 0o600))
	assert.NilError(t, os.WriteFile(path, []byte("four\n"), 0o600))
	assert.Check(t, is.Equal(Tail(path, 3, 1<<10), "two\nthree\nfour"))
	assert.Check(t, is.Equal(Tail(path, 1, 1<<10), "four"))
	assert.Check(t, is.Equal(Tail(filepath.Join(t.TempDir(), "none"), 3, 1<<10), ""))
}

// TestCreateStartsEmpty: a new VM's log does not carry an earlier one's.
func TestCreateStartsEmpty(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	assert.NilError(t, os.WriteFile(path, []byte("old\n"), 0o600))
	assert.NilError(t, os.WriteFile(path+RotatedSuffix, []byte("older\n"), 0o600))
	l, err := Create(path, 0)
	assert.NilError(t, err)
	assert.NilError(t, l.Close())
	assert.Check(t, is.Equal(l.half, int64(DefaultMaxBytes/2)))
	rotated, newest := onDisk(t, path)
	assert.Check(t, is.Len(rotated, 0))
	assert.Check(t, is.Len(newest, 0))

	_, err = Create(path, MinMaxBytes-1)
	assert.Check(t, is.ErrorContains(err, "outside"))
	_, err = Create(path, MaxMaxBytes+1)
	assert.Check(t, is.ErrorContains(err, "outside"))
}
