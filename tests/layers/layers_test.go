// Package layers keeps the module's layering (docs/architecture.md,
// "Layers"): it lists every package's imports with `go list` and fails on
// an import across a forbidden line. The imports that cross one today are
// listed in knownCrossings, each to be removed (issue 22); the test fails
// too when one of them is gone, so the list only shrinks.
package layers

import (
	"encoding/json"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

const module = "github.com/iii-sandbox/iii/"

// rule: packages under From may import packages of the module only under
// one of Allow (their own tree always).
type rule struct {
	From  string
	Allow []string
	Why   string
}

var rules = []rule{
	{From: "host/engine", Allow: []string{"protocol", "internal/"},
		Why: "the engine routes calls; sandbox policy, HTTP functions and RBAC plug into it from above"},
	{From: "protocol", Allow: []string{"internal/"}, Why: "the wire format depends on nothing of the product"},
	{From: "contract", Allow: []string{"protocol", "internal/"}, Why: "the sandbox contract is what adapters and the engine share"},
	{From: "client", Allow: []string{"protocol", "internal/"}, Why: "the Go SDK works against any engine"},
	{From: "plugins/", Allow: []string{"contract", "protocol", "client", "internal/", "plugins/"},
		Why: "adapters are built with the SDK and the contract, never against the engine's insides"},
	{From: "compose/", Allow: []string{"contract", "protocol", "client", "internal/", "compose/"},
		Why: "Compose is an ordinary worker of the engine"},
	{From: "workers/", Allow: []string{"protocol", "client", "internal/", "workers/"},
		Why: "the registry workers are ordinary workers of the engine"},
}

// knownCrossings are today's imports across a line: "from -> to".
var knownCrossings = map[string]bool{
	"host/engine/enginebench -> host/rbac":                       true, // a benchmark of the checked call path
	"host/engine -> host/httpfn":                                 true, // HTTP functions: a hook the engine calls
	"host/engine -> host/rbac":                                   true, // the permission model: a hook, or internal/
}

type pkg struct {
	ImportPath string
	Imports    []string
}

func under(p, prefix string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(p, prefix)
	}
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

func TestLayers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the module")
	}
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", "../../...")
	out, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	assert.NilError(t, cmd.Start())
	dec := json.NewDecoder(out)
	found := map[string]string{}
	n := 0
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else {
			assert.NilError(t, err)
		}
		n++
		from := strings.TrimPrefix(p.ImportPath, module)
		for _, r := range rules {
			if !under(from, r.From) {
				continue
			}
			for _, imp := range p.Imports {
				if !strings.HasPrefix(imp, module) {
					continue
				}
				to := strings.TrimPrefix(imp, module)
				ok := under(to, strings.TrimSuffix(r.From, "/"))
				for _, a := range r.Allow {
					ok = ok || under(to, a)
				}
				if !ok {
					found[from+" -> "+to] = r.Why
				}
			}
		}
	}
	assert.NilError(t, cmd.Wait())
	assert.Assert(t, n > 50, "go list saw only %d packages", n)

	var fresh, gone []string
	for c, why := range found {
		if !knownCrossings[c] {
			fresh = append(fresh, c+" ("+why+")")
		}
	}
	for c := range knownCrossings {
		if _, ok := found[c]; !ok {
			gone = append(gone, c)
		}
	}
	sort.Strings(fresh)
	sort.Strings(gone)
	assert.Check(t, len(fresh) == 0, "imports across a layer (docs/architecture.md, \"Layers\"):\n%s", strings.Join(fresh, "\n"))
	assert.Check(t, len(gone) == 0, "no longer crossing; remove from knownCrossings:\n%s", strings.Join(gone, "\n"))
}

func TestUnder(t *testing.T) {
	for _, tc := range []struct {
		p, prefix string
		want      bool
	}{
		{"host/engine", "host/engine", true},
		{"host/engine/enginebench", "host/engine", true},
		{"host/enginex", "host/engine", false},
		{"internal/x", "internal/", true},
		{"internal", "internal/", false},
	} {
		assert.Check(t, under(tc.p, tc.prefix) == tc.want, "%s under %s", tc.p, tc.prefix)
	}
}
