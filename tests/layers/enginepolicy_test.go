package layers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// Sandbox policy lives with the router (host/router, trust.go) and
// reaches the engine through its registration guard: host/engine keeps
// mechanisms (docs/architecture.md, "Layers"). Imports cannot show a rule
// moving back (it needs no import), so this check reads the engine's
// non-test code: no identifier and no string may speak of sandboxes. Left
// out are comments (they may say why), import paths (the module is
// iii-sandbox), and what the engine must name as the public API it serves:
// the credential spec's sandbox_host block (its JSON field in the
// engine::credentials::issue schema, and the Go field SandboxHost, which
// the closed default refuses) and iii's own reserved prefix "sandbox::"
// (the router's functions, beside "engine::" and "compose::").
const policyWord = "sandbox"

// publicField and publicKey are the spec's block as the engine may name
// it: the Go field, exactly, and the JSON key, quoted as a key is.
const (
	publicField = "SandboxHost"
	publicKey   = `"sandbox_host"`
)

// policyMentions returns, as "file:line: what", every identifier and
// string literal of src that names sandboxes, but for the public names.
func policyMentions(fset *token.FileSet, name string, src []byte) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []string
	report := func(n ast.Node, what string) {
		out = append(out, fset.Position(n.Pos()).String()+": "+what)
	}
	named := func(s string) bool { return strings.Contains(strings.ToLower(s), policyWord) }
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ImportSpec:
			return false // the module path
		case *ast.Ident:
			if n.Name != publicField && named(n.Name) {
				report(n, "identifier "+n.Name)
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(n.Value)
			if err != nil {
				s = n.Value
			}
			if s != "sandbox::" && named(strings.ReplaceAll(s, publicKey, "")) {
				report(n, "string "+n.Value)
			}
		}
		return true
	})
	return out, nil
}

// enginePolicy runs policyMentions over the non-test Go files under dir.
func enginePolicy(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	var out []string
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		found, err := policyMentions(fset, path, src)
		if err != nil {
			return err
		}
		files++
		out = append(out, found...)
		return nil
	})
	assert.NilError(t, err)
	assert.Assert(t, files > 20, "read only %d files under %s", files, dir)
	return out
}

func TestEngineHasNoSandboxPolicy(t *testing.T) {
	dir := filepath.Join("..", "..", "host", "engine")
	if d := os.Getenv("III_POLICY_CHECK_DIR"); d != "" {
		dir = d // to run the check over another tree, e.g. an older commit's
	}
	found := enginePolicy(t, dir)
	assert.Check(t, len(found) == 0, "sandbox policy in host/engine (it belongs to host/router's trust rules):\n%s", strings.Join(found, "\n"))
}

// TestPolicyCheckCatchesViolations: deliberate violations are reported, so
// TestEngineHasNoSandboxPolicy cannot pass because the check sees nothing;
// the rules that lived in the engine before they moved are among them.
func TestPolicyCheckCatchesViolations(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"a rule named for sandboxes", `func servesSandboxes(id string) bool { return false }`, []string{"identifier servesSandboxes"}},
		{"a type of the policy", `type sandboxHost struct{ adapter string }`, []string{"identifier sandboxHost"}},
		{"a method of the policy", `func (p *principal) admitSandboxHost() {}`, []string{"identifier admitSandboxHost"}},
		{"a policy message", `var m = "the sandbox host credential " + label`, []string{`string "the sandbox host credential "`}},
		{"a log line", "func f() { log.Warn(`Sandbox host did not answer`) }", []string{"string `Sandbox host did not answer`"}},
		{"a field beside the public one", `var x = spec.SandboxHostName`, []string{"identifier SandboxHostName"}},
		{"a comment", "// sandbox hosts are judged by the router\nvar x = 1", nil},
		{"the module's import path", `import "github.com/iii-sandbox/iii/protocol"`, nil},
		{"the public spec's field", `var ok = spec.SandboxHost != nil`, nil},
		{"the schema's field", "var s = `{\"sandbox_host\":{\"type\":\"object\"}}`", nil},
		{"a message on the block", `var m = "sandbox_host.adapter is not an adapter name"`, []string{`string "sandbox_host.adapter is not an adapter name"`}},
		{"iii's reserved prefix", `var p = []string{"engine::", "sandbox::"}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policyMentions(token.NewFileSet(), "x.go", []byte("package engine\n"+tc.src+"\n"))
			assert.NilError(t, err)
			for i := range got {
				_, what, _ := strings.Cut(got[i], ": ")
				got[i] = what
			}
			assert.Check(t, is.DeepEqual(got, tc.want))
		})
	}
}
