package adapterproc

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
)

// The SDK's tiny test adapter, started for real: it hands shakes,
// dispenses, answers Info, and Configure passes its refusal through
// unchanged.
func TestTinyAdapter(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs an adapter binary")
	}
	bin := filepath.Join(t.TempDir(), "tinyadapter")
	out, err := bins.GoBuild(bin, "../../../plugins/sdk/testdata/tinyadapter", nil)
	assert.NilError(t, err, "%s", out)

	logs := &syncbuf.Buffer{}
	c := NewClient(Options{Cmd: exec.Command(bin), Stderr: logs,
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})})
	defer c.Kill()
	a, err := Dispense(c)
	assert.NilError(t, err, "%s", logs.String())
	ctx := context.Background()
	info, err := a.Info(ctx)
	assert.NilError(t, err)
	assert.Equal(t, info.Adapter, "tinyadapter")

	assert.NilError(t, Configure(ctx, a, map[string]any{"image_allowlist": []string{"python"}}))
	err = Configure(ctx, a, map[string]any{"reject": "max_widgets must be a number"})
	assert.Check(t, is.ErrorContains(err, "max_widgets must be a number"))

	err = Configure(ctx, a, map[string]any{"bad": make(chan int)})
	assert.Check(t, is.ErrorContains(err, "marshal the adapter configuration"))
}

// A binary that is not an adapter fails the handshake with an error, not
// a hang or a panic.
func TestNotAnAdapter(t *testing.T) {
	truePath, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true binary")
	}
	c := NewClient(Options{Cmd: exec.Command(truePath), Logger: hclog.NewNullLogger()})
	defer c.Kill()
	_, err = Dispense(c)
	assert.Check(t, is.ErrorContains(err, "start the adapter"))
}
