package e2e

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
)

// presetConfig boots image with the memory the Makefile's catalog
// defaults give every sandbox (default_memory_mb 512).
func presetConfig(image string) map[string]any {
	return map[string]any{"image_allowlist": []any{image}, "default_memory_mb": 512}
}

// pythonPresetScript uses what the python preset promises a code
// interpreter: the standard library, numpy, pandas and matplotlib drawing
// a PNG headless (MPLBACKEND=Agg from the image). It prints the PNG's
// signature and the process's peak memory.
const pythonPresetScript = `
import json, sqlite3, asyncio, decimal, dataclasses, urllib.request, unittest, venv
import numpy, pandas, matplotlib
import matplotlib.pyplot as plt
assert matplotlib.get_backend().lower() == "agg", matplotlib.get_backend()
db = sqlite3.connect(":memory:")
db.execute("create table t (x)")
df = pandas.DataFrame({"x": numpy.arange(4)})
plt.plot(df["x"], df["x"] ** 2)
plt.savefig("/tmp/plot.png")
with open("/tmp/plot.png", "rb") as f:
    sig = f.read(8)
print(json.dumps({"sum": int(df["x"].sum()), "png": sig == b"\x89PNG\r\n\x1a\n"}))
for line in open("/proc/self/status"):
    if line.startswith("VmHWM"):
        print(line.split()[1])
`

// TestPythonPreset: the python preset is a usable code interpreter, with
// pip, under the catalog's default memory.
func TestPythonPreset(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), presetConfig("python"))
	id := p.create(t, nil)
	began := time.Now()
	out := p.exec(t, id, "python3", "-c", pythonPresetScript)
	assert.Assert(t, out.Success, "exit %v, stderr %s", out.ExitCode, out.Stderr)
	lines := strings.Split(strings.TrimSpace(out.Stdout), "\n")
	assert.Equal(t, len(lines), 2, "stdout %q", out.Stdout)
	assert.Equal(t, lines[0], `{"sum": 6, "png": true}`)
	t.Logf("imports + plot: %v, peak RSS %s kB", time.Since(began).Round(time.Millisecond), lines[1])
	assert.Equal(t, p.sh(t, id, "python3 -m pip --version | cut -d' ' -f1"), "pip\n")
	p.stop(t, id)
}

// TestNodePreset: the node preset carries npm.
func TestNodePreset(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	if !layoutHas(e.layout, nodeRef) {
		t.Skipf("the node image is not in the local OCI layout %s: run scripts/build-images.sh", e.layout)
	}
	p := start(t, e, dirs.Short(t, "sb"), presetConfig("node"))
	id := p.create(t, map[string]any{"image": "node"})
	assert.Equal(t, p.sh(t, id, "node -e 'console.log(6*7)'"), "42\n")
	v := p.sh(t, id, "npm --version")
	assert.Assert(t, strings.Count(v, ".") == 2, "npm --version printed %q", v)
	// Upstream's Node, not Debian's 18: the startup snapshot and the
	// compile cache (22.1) are what make it start in under a second
	// under TCG.
	assert.Equal(t, p.sh(t, id, `node -p 'Number(process.versions.node.split(".")[0]) >= 22 && process.config.variables.node_use_node_snapshot && typeof require("node:module").enableCompileCache'`), "function\n")
	// npm runs on it and can drive a project (no network needed).
	assert.Equal(t, p.sh(t, id, "mkdir -p /tmp/p && cd /tmp/p && npm init -y >/dev/null && npm pkg set scripts.x='echo ran' && npm run -s x"), "ran\n")
	assert.Equal(t, p.sh(t, id, "readlink -f /usr/bin/node"), "/usr/local/bin/node\n")
	p.stop(t, id)
}
