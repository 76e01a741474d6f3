package e2e

import (
	"bytes"
	"encoding/json"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// `iii call sandbox::create` on an adapter with an empty cache shows the
// image pull, the unpack, the erofs build, the VM boot and ready, in that
// order, as the real binary draws them on a stderr that is not a terminal;
// stdout is the usual result, naming the sandbox ready named. The chain is
// all real: the iii binary, the engine and router, the plugin host,
// sandbox-libkrun pulling from a registry over HTTP and booting a VM.
func TestCallShowsProgress(t *testing.T) {
	t.Parallel()
	s := needVMs(t)
	ctx := ctxT(t)

	eng := startPullingAdapter(t, s, "e2e-progress", nil)

	u, err := url.Parse(eng.url)
	assert.NilError(t, err)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, s.iii, "call", "sandbox::create", "image=python",
		"--address", u.Hostname(), "--port", u.Port(), "--timeout-ms", "600000")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	assert.NilError(t, err, "stderr:\n%s", stderr.String())

	var out struct {
		SandboxID string `json:"sandbox_id"`
		Image     string `json:"image"`
	}
	assert.NilError(t, json.Unmarshal(stdout.Bytes(), &out), "stdout: %s", stdout.String())
	assert.Assert(t, out.SandboxID != "")
	t.Cleanup(func() {
		eng.call(t, "sandbox::stop", map[string]any{"sandbox_id": out.SandboxID, "wait": true}, nil)
	})

	// Each line names the image; a phase's first line opens it, byte
	// counts follow. Reduce the lines to the sequence of phases.
	name := regexp.QuoteMeta("python (" + pythonRef + "): ")
	line := regexp.MustCompile(`^` + name + `(pulling|unpacking|building the root filesystem|booting the VM|ready, sandbox (\S+))( .*)?$`)
	var phases []string
	sawBytes := map[string]bool{}
	for _, l := range strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		assert.Assert(t, m != nil, "an unexpected progress line %q in:\n%s", l, stderr.String())
		phase := m[1]
		if m[2] != "" {
			phase = "ready"
			assert.Check(t, is.Equal(m[2], out.SandboxID), "ready names another sandbox")
		}
		if strings.Contains(m[3], " of ") {
			sawBytes[phase] = true
		}
		if len(phases) == 0 || phases[len(phases)-1] != phase {
			phases = append(phases, phase)
		}
	}
	assert.DeepEqual(t, phases, []string{"pulling", "unpacking", "building the root filesystem", "booting the VM", "ready"})
	assert.Check(t, sawBytes["pulling"], "the pull never counted bytes:\n%s", stderr.String())
	assert.Check(t, sawBytes["unpacking"], "the unpack never counted bytes:\n%s", stderr.String())
	t.Logf("iii call's stderr:\n%s", stderr.String())
}
