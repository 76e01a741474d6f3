package libkrun

import (
	"bufio"
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestBootConsoleOut: with ConsoleOut the console goes into the caller's
// pipe (whose reader caps the log), and no file is opened for it.
func TestBootConsoleOut(t *testing.T) {
	f := openFake(t, -22, false)
	_, kernel, _, _ := vmFiles(t)
	spec := bootSpec(kernel)
	spec.Cmdline = "console=ttyS0"
	spec.OnChannel = func(h *os.File) error { return h.Close() }
	r, w, err := os.Pipe()
	assert.NilError(t, err)
	defer r.Close()
	spec.ConsoleOut = w
	expectStart(t, f.lib.Boot(context.Background(), spec), syscall.EINVAL)
	assert.NilError(t, w.Close())
	// The fake wrote a line into the console's descriptor (libkrun's
	// copy of the pipe, still open as after a real start).
	assert.NilError(t, r.SetReadDeadline(time.Now().Add(20*time.Second)))
	line, err := bufio.NewReader(r).ReadString('\n')
	assert.NilError(t, err)
	assert.Check(t, is.Equal(line, "kernel console line\n"))
	assert.Check(t, strings.Contains(f.calls(t), "krun_add_serial_console_default"))
}
