package workervm

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestInstallInputs keys an install step on a real copy of a workspace:
// each input changes the key, and the log names it; an edit to anything
// else leaves the install done.
func TestInstallInputs(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		"package.json":       `{"name":"w","dependencies":{"iii-sdk":"0.22.1"}}`,
		"package-lock.json":  `{"lockfileVersion":3}`,
		"requirements.txt":   "requests==2.32.3\n",
		"index.mjs":          "console.log(1)\n",
		"src/package.json":   `{"name":"nested"}`,
		"node_modules/x.js":  "x",
		"README.md":          "hello\n",
		"lib/requirements.x": "not a manifest",
	}
	const (
		cmd    = "npm ci"
		digest = "sha256:aaaa"
	)
	env := []string{"HOME=/root", "NODE_ENV=production", "III_URL=ws://10.0.2.2:49134", "III_ENGINE_URL=ws://10.0.2.2:49134"}

	// key copies the workspace as the worker's copy step does and keys
	// the install on what it sent.
	key := func(t *testing.T, files map[string]string, cmd string, env []string, digest string) installInputs {
		t.Helper()
		root := t.TempDir()
		for name, content := range files {
			p := filepath.Join(root, filepath.FromSlash(name))
			assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			assert.NilError(t, os.WriteFile(p, []byte(content), 0o644))
		}
		st, err := writeWorkspaceTar(context.Background(), io.Discard, root, copyRule{})
		assert.NilError(t, err)
		return newInstallInputs(cmd, env, digest, st.Manifests)
	}
	with := func(name, content string) map[string]string {
		out := map[string]string{}
		for k, v := range base {
			out[k] = v
		}
		if content == "" {
			delete(out, name)
		} else {
			out[name] = content
		}
		return out
	}
	done := key(t, base, cmd, env, digest).encode()

	for _, tc := range []struct {
		name   string
		files  map[string]string
		cmd    string
		env    []string
		digest string
		// why is the log's reason; "" means the install is done.
		why string
	}{
		{name: "unchanged", why: ""},
		{name: "a field added to package.json", files: with("package.json", `{"name":"w","scripts":{"x":"y"},"dependencies":{"iii-sdk":"0.22.1"}}`), why: "inputs changed (package.json)"},
		{name: "the lock file edited", files: with("package-lock.json", `{"lockfileVersion":2}`), why: "inputs changed (package-lock.json)"},
		{name: "a lock file appears", files: with("yarn.lock", "# yarn\n"), why: "inputs changed (yarn.lock)"},
		{name: "a manifest goes", files: with("requirements.txt", ""), why: "inputs changed (requirements.txt)"},
		{name: "requirements-dev.txt matches the pattern", files: with("requirements-dev.txt", "pytest\n"), why: "inputs changed (requirements-dev.txt)"},
		{name: "the command", cmd: "npm ci --omit=dev", why: "inputs changed (command)"},
		{name: "the environment", env: []string{"HOME=/root", "NODE_ENV=development"}, why: "inputs changed (environment)"},
		{name: "the image", digest: "sha256:bbbb", why: "inputs changed (image)"},
		{name: "code edited", files: with("index.mjs", "console.log(2)\n"), why: ""},
		{name: "a new source file", files: with("app.mjs", "export {}\n"), why: ""},
		{name: "a nested package.json", files: with("src/package.json", `{"name":"nested","version":"2.0.0"}`), why: ""},
		{name: "what the install made", files: with("node_modules/x.js", "y"), why: ""},
		{name: "the engine on another port", env: []string{"HOME=/root", "NODE_ENV=production", "III_URL=ws://10.0.2.2:1", "III_ENGINE_URL=ws://10.0.2.2:1"}, why: ""},
		{name: "the environment in another order", env: []string{"III_URL=ws://10.0.2.2:49134", "NODE_ENV=production", "HOME=/root"}, why: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			files, c, e, d := base, cmd, env, digest
			if tc.files != nil {
				files = tc.files
			}
			if tc.cmd != "" {
				c = tc.cmd
			}
			if tc.env != nil {
				e = tc.env
			}
			if tc.digest != "" {
				d = tc.digest
			}
			want := key(t, files, c, e, d)
			assert.Equal(t, installReason(want, done, true), tc.why)
			if tc.why != "" {
				assert.Check(t, want.encode() != done)
			}
		})
	}
}

func TestInstallRecord(t *testing.T) {
	t.Parallel()
	want := newInstallInputs("npm ci", []string{"A=1"}, "sha256:aa", map[string]string{"package.json": "ab12"})
	rec := want.encode()
	got, ok := parseInstallRecord(rec)
	assert.Assert(t, ok)
	assert.DeepEqual(t, got, want)

	for _, tc := range []struct {
		name, record string
		present      bool
		why          string
	}{
		{name: "no record", present: false, why: "first install on this disk"},
		{name: "the same inputs", record: rec, present: true, why: ""},
		{name: "an earlier version's command hash", record: hexSum("npm ci") + "\n", present: true,
			why: "inputs changed (the record on this disk is from an earlier version, which keyed on the command alone)"},
		{name: "a damaged record", record: installRecordHeader + "\ncommand\n", present: true,
			why: "inputs changed (the record on this disk is from an earlier version, which keyed on the command alone)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Check(t, is.Equal(installReason(want, tc.record, tc.present), tc.why))
		})
	}
}

func TestIsInstallManifest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rel  string
		want bool
	}{
		{"package.json", true},
		{"requirements.txt", true},
		{"requirements-dev.txt", true},
		{"go.sum", true},
		{"Cargo.lock", true},
		{"src/package.json", false},
		{"index.mjs", false},
		{"requirements.in", false},
	} {
		assert.Check(t, is.Equal(isInstallManifest(tc.rel), tc.want), tc.rel)
	}
}
