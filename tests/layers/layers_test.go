// Package layers keeps the module's layering (docs/architecture.md,
// "Layers"): it lists every package's imports with `go list` and fails on
// an import across a forbidden line. knownCrossings lists the imports
// excused while a change removes them (none since issue 22); the test
// fails too when one of them is gone, so the list only shrinks.
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
// one of Allow (their own tree always), and never under one of Deny.
type rule struct {
	From  string
	Allow []string
	// Deny are trees inside Allow that From still may not import.
	Deny []string
	Why  string
}

// layerRules are the lines docs/architecture.md ("Layers") draws.
func layerRules() []rule {
	return []rule{
		{From: "host/engine", Allow: []string{"protocol", "internal/"},
			Why: "the engine routes calls; sandbox policy, HTTP functions and RBAC plug into it from above"},
		{From: "protocol", Allow: []string{"internal/"}, Why: "the wire format depends on nothing of the product"},
		{From: "contract", Allow: []string{"protocol", "internal/"}, Why: "the sandbox contract is what adapters and the engine share"},
		{From: "client", Allow: []string{"protocol", "internal/"}, Why: "the Go SDK works against any engine"},
		{From: "plugins/", Allow: []string{"contract", "protocol", "client", "internal/", "plugins/"},
			Why: "adapters are built with the SDK and the contract, never against the engine's insides"},
		{From: "compose/", Allow: []string{"contract", "protocol", "client", "internal/", "compose/"},
			Why: "Compose is an ordinary worker of the engine"},
		// compose/daemon orchestrates the file editor, the managed engine
		// and the VM workers; each does one job, so none of them imports
		// the daemon or another of them.
		{From: "compose/fileedit", Allow: []string{"contract", "protocol", "client", "internal/", "compose"},
			Deny: []string{"compose/daemon", "compose/engineproc", "compose/vmworkers"},
			Why:  "the compose file editor is a part compose/daemon uses, not a user of it"},
		{From: "compose/engineproc", Allow: []string{"contract", "protocol", "client", "internal/", "compose"},
			Deny: []string{"compose/daemon", "compose/fileedit", "compose/vmworkers"},
			Why:  "the managed engine is a part compose/daemon uses, not a user of it"},
		{From: "compose/vmworkers", Allow: []string{"contract", "protocol", "client", "internal/", "compose"},
			Deny: []string{"compose/daemon", "compose/fileedit", "compose/engineproc"},
			Why:  "the VM workers are a part compose/daemon uses, not a user of it"},
		// sandbox-libkrun: the adapter wires the sandboxes to the worker
		// VMs and the boot pipeline; the worker VMs boot through the
		// pipeline; the pipeline knows neither; the configuration is read
		// by all three and reads none of them.
		{From: "plugins/sandbox-libkrun/boot", Allow: []string{"contract", "protocol", "client", "internal/", "plugins/"},
			Deny: []string{"plugins/sandbox-libkrun/adapter", "plugins/sandbox-libkrun/workervm"},
			Why:  "the boot pipeline is what sandboxes and worker VMs boot through, not a user of them"},
		{From: "plugins/sandbox-libkrun/workervm", Allow: []string{"contract", "protocol", "client", "internal/", "plugins/"},
			Deny: []string{"plugins/sandbox-libkrun/adapter"},
			Why:  "the worker VMs are a part the adapter uses, not a user of it"},
		{From: "plugins/sandbox-libkrun/config", Allow: []string{"contract", "protocol", "client", "internal/", "plugins/"},
			Deny: []string{"plugins/sandbox-libkrun/adapter", "plugins/sandbox-libkrun/boot", "plugins/sandbox-libkrun/workervm"},
			Why:  "the adapter's configuration is read by its parts and reads none of them"},
		{From: "workers/", Allow: []string{"protocol", "client", "internal/", "workers/"},
			Why: "the registry workers are ordinary workers of the engine"},
	}
}

// knownCrossings are today's imports across a line, "from -> to", each
// to be removed: none since issue 22 (the engine takes HTTP functions
// through a hook, and the permission model is internal/rbac). A crossing
// may only be listed here while the change that removes it is under way.
func knownCrossings() map[string]bool {
	return map[string]bool{}
}

// pkg is one package as `go list -json=ImportPath,Imports` prints it: its
// non-test imports (a test may reach across a line to check both sides
// agree, e.g. that Compose's generated config.yaml parses with host/config).
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

// crossings returns every import of the module's packages in pkgs that
// crosses one of rules, "from -> to" (module prefix trimmed), with the
// rule's reason.
func crossings(pkgs []pkg, rules []rule) map[string]string {
	found := map[string]string{}
	for _, p := range pkgs {
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
				for _, dn := range r.Deny {
					ok = ok && !under(to, dn)
				}
				if !ok {
					found[from+" -> "+to] = r.Why
				}
			}
		}
	}
	return found
}

// verdict compares found crossings with the known ones: fresh are new
// crossings (the build must fail), gone are known ones no longer found
// (the list must shrink with the code).
func verdict(found map[string]string, known map[string]bool) (fresh, gone []string) {
	for c, why := range found {
		if !known[c] {
			fresh = append(fresh, c+" ("+why+")")
		}
	}
	for c := range known {
		if _, ok := found[c]; !ok {
			gone = append(gone, c)
		}
	}
	sort.Strings(fresh)
	sort.Strings(gone)
	return fresh, gone
}

func listModule(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", "../../...")
	out, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	assert.NilError(t, cmd.Start())
	dec := json.NewDecoder(out)
	var pkgs []pkg
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else {
			assert.NilError(t, err)
		}
		pkgs = append(pkgs, p)
	}
	assert.NilError(t, cmd.Wait())
	return pkgs
}

func TestLayers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the module")
	}
	pkgs := listModule(t)
	assert.Assert(t, len(pkgs) > 50, "go list saw only %d packages", len(pkgs))

	fresh, gone := verdict(crossings(pkgs, layerRules()), knownCrossings())
	assert.Check(t, len(fresh) == 0, "imports across a layer (docs/architecture.md, \"Layers\"):\n%s", strings.Join(fresh, "\n"))
	assert.Check(t, len(gone) == 0, "no longer crossing; remove from knownCrossings:\n%s", strings.Join(gone, "\n"))
}

// TestCheckerCatchesWrongImports runs the checker over a synthetic import
// graph: a deliberately wrong import must be reported, so TestLayers cannot
// pass because the checker sees nothing. The crossings removed in issue 22
// are among the cases: were one to come back, the build fails.
func TestCheckerCatchesWrongImports(t *testing.T) {
	for _, tc := range []struct {
		name, from, to string
		crosses        bool
	}{
		{"sdk imports the plugin host's schemas", "plugins/sdk", "host/pluginhost/schema", true},
		{"compose imports the engine", "compose/daemon", "host/engine", true},
		{"compose imports the engine's config", "compose/composefile", "host/config", true},
		{"workerkit imports the engine's config", "workers/workerkit", "host/config", true},
		{"compose imports an adapter's package", "compose/packages", "plugins/sandbox-libkrun/images/extract", true},
		{"engine imports the contract", "host/engine", "contract", true},
		{"engine imports the router", "host/engine", "host/router", true},
		{"protocol imports the contract", "protocol", "contract", true},
		{"contract imports the engine", "contract/schema", "host/engine", true},
		{"client imports compose", "client", "compose", true},
		{"a worker imports the contract", "workers/http", "contract", true},
		{"a prefix is not a tree", "host/engine", "protocolx", true},
		{"engine imports the HTTP-function invoker", "host/engine", "host/httpfn", true},
		{"engine imports a host package", "host/engine", "host/rbac", true},
		{"the engine's benchmark imports a host package", "host/engine/enginebench", "host/config", true},
		{"the file editor imports the daemon", "compose/fileedit", "compose/daemon", true},
		{"the managed engine imports the daemon", "compose/engineproc", "compose/daemon", true},
		{"the VM workers import the daemon", "compose/vmworkers", "compose/daemon", true},
		{"the VM workers import the engine", "compose/vmworkers", "host/engine", true},
		{"the managed engine imports the engine's config", "compose/engineproc", "host/config", true},
		{"the managed engine imports the file editor", "compose/engineproc", "compose/fileedit", true},
		{"the file editor imports the VM workers", "compose/fileedit", "compose/vmworkers", true},
		{"the boot pipeline imports the adapter", "plugins/sandbox-libkrun/boot", "plugins/sandbox-libkrun/adapter", true},
		{"the boot pipeline imports the worker VMs", "plugins/sandbox-libkrun/boot", "plugins/sandbox-libkrun/workervm", true},
		{"the worker VMs import the adapter", "plugins/sandbox-libkrun/workervm", "plugins/sandbox-libkrun/adapter", true},
		{"the adapter's configuration imports the boot pipeline", "plugins/sandbox-libkrun/config", "plugins/sandbox-libkrun/boot", true},
		{"the adapter's configuration imports the adapter", "plugins/sandbox-libkrun/config", "plugins/sandbox-libkrun/adapter", true},
		{"the worker VMs import the host", "plugins/sandbox-libkrun/workervm", "host/engine", true},
		{"sdk imports the contract's schemas", "plugins/sdk", "contract/schema", false},
		{"the worker VMs boot through the pipeline", "plugins/sandbox-libkrun/workervm", "plugins/sandbox-libkrun/boot", false},
		{"the boot pipeline reads the configuration", "plugins/sandbox-libkrun/boot", "plugins/sandbox-libkrun/config", false},
		{"the boot pipeline uses the runner", "plugins/sandbox-libkrun/boot", "plugins/sandbox-libkrun/runner", false},
		{"the adapter wires the worker VMs", "plugins/sandbox-libkrun/adapter", "plugins/sandbox-libkrun/workervm", false},
		{"the adapter wires the boot pipeline", "plugins/sandbox-libkrun/adapter", "plugins/sandbox-libkrun/boot", false},
		{"the daemon imports the VM workers", "compose/daemon", "compose/vmworkers", false},
		{"the daemon imports the managed engine", "compose/daemon", "compose/engineproc", false},
		{"the file editor imports the compose file model", "compose/fileedit", "compose/composefile", false},
		{"the managed engine imports the process tools", "compose/engineproc", "compose/proc", false},
		{"the file editor imports the YAML builders", "compose/fileedit", "compose/yamlbuild", false},
		{"the managed engine imports the YAML builders", "compose/engineproc", "compose/yamlbuild", false},
		{"the VM workers import the contract", "compose/vmworkers", "contract", false},
		{"the VM workers import the Compose errors", "compose/vmworkers", "compose", false},
		{"compose imports protocol", "compose/daemon", "protocol", false},
		{"compose imports internal", "compose/composefile", "internal/envexpand", false},
		{"an adapter imports internal", "plugins/sandbox-libkrun/images", "internal/tarextract", false},
		{"engine imports internal", "host/engine", "internal/adaptername", false},
		{"engine imports the permission model", "host/engine", "internal/rbac", false},
		{"engine imports its own tree", "host/engine", "host/engine/enginetest", false},
		{"contract imports internal", "contract", "internal/adaptername", false},
		{"a plugin imports another plugin", "plugins/sandbox-libkrun/adapter", "plugins/sdk/sandboxkit", false},
		{"the host above the engine is unruled", "host/router", "host/engine", false},
		{"imports outside the module are ignored", "host/engine", "github.com/other/x", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := module + tc.to
			if strings.Contains(tc.to, ".") {
				to = tc.to
			}
			found := crossings([]pkg{{ImportPath: module + tc.from, Imports: []string{"fmt", to}}}, layerRules())
			edge := tc.from + " -> " + tc.to
			_, got := found[edge]
			assert.Check(t, got == tc.crosses, "%s: crossing reported %v, want %v (found %v)", edge, got, tc.crosses, found)
			if tc.crosses {
				fresh, _ := verdict(found, knownCrossings())
				assert.Check(t, len(fresh) == 1, "%s is not excused by knownCrossings: %v", edge, fresh)
			}
		})
	}
}

// TestVerdict: a known crossing that is gone is reported, so the list of
// known crossings only shrinks.
func TestVerdict(t *testing.T) {
	fresh, gone := verdict(map[string]string{"a -> b": "why"}, map[string]bool{"a -> b": true, "c -> d": true})
	assert.DeepEqual(t, fresh, []string(nil))
	assert.DeepEqual(t, gone, []string{"c -> d"})
	fresh, gone = verdict(map[string]string{"e -> f": "why"}, nil)
	assert.DeepEqual(t, fresh, []string{"e -> f (why)"})
	assert.DeepEqual(t, gone, []string(nil))
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
