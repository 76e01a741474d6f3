package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestLaunchCapsConsoleAndStderr: a stand-in for QEMU that writes 8 MiB
// to the console's descriptor (the one -add-fd names) and 4 MiB to its
// stderr as fast as it can, then exits, leaves console.log and
// qemu.stderr (with their rotated files) within their caps, their tails
// still readable.
func TestLaunchCapsConsoleAndStderr(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "qemu-system-fake")
	script := `#!/bin/sh
fd=""
for a in "$@"; do
  case "$a" in fd=*,set=1) fd="${a#fd=}"; fd="${fd%%,*}";; esac
done
[ -n "$fd" ] || { echo "no console fd in: $*" >&2; exit 3; }
i=0
while [ $i -lt 4096 ]; do
  printf '%2040d console line\n' $i
  i=$((i+1))
done >&$fd
i=0
while [ $i -lt 2048 ]; do
  printf '%2040d stderr line\n' $i
  i=$((i+1))
done >&2
echo "the last console line" >&$fd
echo "the last stderr line" >&2
exit 1
`
	assert.NilError(t, os.WriteFile(fake, []byte(script), 0o755))
	const consoleCap = 256 << 10
	cfg := Config{QEMU: fake, Arch: "amd64", Accel: AccelTCG, Kernel: "/k", Initrd: "/i", StateDir: filepath.Join(dir, "vm"),
		TSCKHz: 1, ConsoleMaxBytes: consoleCap}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := Launch(ctx, cfg)
	var qe *Error
	assert.Assert(t, errors.As(err, &qe), "%v", err)
	assert.Check(t, is.Equal(qe.Code, CodeStartFailed))
	assert.Check(t, strings.HasSuffix(qe.ConsoleTail, "the last console line"), qe.ConsoleTail)
	assert.Check(t, strings.HasSuffix(qe.StderrTail, "the last stderr line"), qe.StderrTail)

	size := func(name string) int64 {
		fi, err := os.Stat(filepath.Join(cfg.StateDir, name))
		assert.NilError(t, err)
		return fi.Size()
	}
	console := size(ConsoleName) + size(ConsoleName+".1")
	stderr := size(StderrName) + size(StderrName+".1")
	t.Logf("console %d bytes, stderr %d bytes on disk", console, stderr)
	assert.Check(t, console <= consoleCap, "console log %d bytes, cap %d", console, consoleCap)
	assert.Check(t, stderr <= stderrMaxBytes, "stderr %d bytes, cap %d", stderr, stderrMaxBytes)
}
