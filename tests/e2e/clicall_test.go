package e2e

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/icmd"

	"github.com/iii-sandbox/iii/internal/testkit/keeper"
)

// cli calls an engine as a user does: `iii call` with the environment and
// working directory a test gives it.
type cli struct {
	iii, dir string
	port     int
	env      []string
}

// call runs `iii call` with args (a function id, then its payload flags).
func (c cli) call(args ...string) *icmd.Result {
	return icmd.RunCmd(icmd.Command(c.iii, append([]string{"call", "--port", strconv.Itoa(c.port), "--timeout-ms", "300000"}, args...)...),
		icmd.WithEnv(c.env...), icmd.Dir(c.dir), icmd.WithTimeout(6*time.Minute))
}

// callJSON calls fn with payload as JSON, asserts success and decodes the
// result into out (when not nil).
func (c cli) callJSON(t *testing.T, fn string, payload, out any) {
	t.Helper()
	b, err := json.Marshal(payload)
	assert.NilError(t, err)
	res := c.call(fn, "--json", string(b))
	res.Assert(t, icmd.Success)
	if out != nil {
		assert.NilError(t, json.Unmarshal([]byte(res.Stdout()), out), res.Stdout())
	}
}

// sh runs script with /bin/sh in sandbox id, asserts it exited 0 and
// returns its stdout.
func (c cli) sh(t *testing.T, id, script string) string {
	t.Helper()
	var out struct {
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		ExitCode *int   `json:"exit_code"`
	}
	c.callJSON(t, "sandbox::exec", map[string]any{"sandbox_id": id, "argv": []string{"/bin/sh", "-c", script}}, &out)
	assert.Assert(t, out.ExitCode != nil && *out.ExitCode == 0, "exec %q: %+v", script, out)
	return out.Stdout
}

// create makes a python sandbox (extra adds to the request) and returns
// its id.
func (c cli) create(t *testing.T, extra map[string]any) string {
	t.Helper()
	payload := map[string]any{"image": "python"}
	for k, v := range extra {
		payload[k] = v
	}
	var out struct {
		SandboxID string `json:"sandbox_id"`
	}
	c.callJSON(t, "sandbox::create", payload, &out)
	assert.Assert(t, out.SandboxID != "")
	return out.SandboxID
}

// startKeeper starts the keeper (internal/testkit/keeper) detached in
// sandbox id.
func (c cli) startKeeper(t *testing.T, id string) {
	t.Helper()
	c.callJSON(t, "sandbox::fs::write", map[string]any{"sandbox_id": id, "path": "/tmp/keeper.py", "content": keeper.Script}, nil)
	c.sh(t, id, "nohup python3 /tmp/keeper.py >/dev/null 2>&1 &")
}

// askKeeper asks the keeper in sandbox id: its secret, its counter, its
// pid.
func (c cli) askKeeper(t *testing.T, id string) (secret string, n int, pid string) {
	t.Helper()
	f := strings.Fields(c.sh(t, id, keeper.Ask))
	assert.Assert(t, is.Len(f, 3), "the keeper did not answer: %q", f)
	n, err := strconv.Atoi(f[1])
	assert.NilError(t, err)
	return f[0], n, f[2]
}
