package pluginhost

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

// Installed names the adapters Find could run: every executable in
// ~/.iii/plugins, sandbox-* ones on $III_PLUGIN_PATH and beside iii, and
// the package cache's sandbox-* entries.
func TestInstalled(t *testing.T) {
	home, bin, extra, state := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	write := func(path string, mode os.FileMode) {
		assert.NilError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		assert.NilError(t, os.WriteFile(path, []byte("#!/bin/sh\n"), mode))
	}
	write(filepath.Join(home, ".iii", "plugins", "remote"), 0o755)
	write(filepath.Join(home, ".iii", "plugins", "not-executable"), 0o644)
	write(filepath.Join(bin, "iii"), 0o755)
	write(filepath.Join(bin, "sandbox-libkrun"), 0o755)
	write(filepath.Join(extra, "sandbox-extra"), 0o755)
	write(filepath.Join(extra, "helper"), 0o755)
	assert.NilError(t, os.MkdirAll(filepath.Join(state, "packages", "sandbox-cached-0.3.1-linux-amd64"), 0o755))
	assert.NilError(t, os.MkdirAll(filepath.Join(state, "packages", "state-0.1.0-linux-amd64"), 0o755))
	f := Finder{
		Getenv: func(k string) string {
			switch k {
			case EnvPluginPath:
				return extra + string(os.PathListSeparator) + "relative/dir"
			case EnvComposeStateDir:
				return state
			}
			return ""
		},
		HomeDir:    func() (string, error) { return home, nil },
		Executable: func() (string, error) { return filepath.Join(bin, "iii"), nil },
	}
	assert.DeepEqual(t, f.Installed(), []string{"remote", "sandbox-cached", "sandbox-extra", "sandbox-libkrun"})
}
