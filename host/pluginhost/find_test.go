package pluginhost

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// layout builds a fake home, package cache, plugin path and iii install.
type layout struct {
	root, home, cache, pathA, pathB, bin string
}

func newLayout(t *testing.T) layout {
	root := t.TempDir()
	l := layout{
		root:  root,
		home:  filepath.Join(root, "home"),
		cache: filepath.Join(root, "state", "packages"),
		pathA: filepath.Join(root, "pa"),
		pathB: filepath.Join(root, "pb"),
		bin:   filepath.Join(root, "opt", "bin"),
	}
	for _, d := range []string{l.home, l.cache, l.pathA, l.pathB, l.bin} {
		assert.NilError(t, os.MkdirAll(d, 0o755))
	}
	return l
}

func (l layout) finder(env map[string]string) Finder {
	return Finder{
		Getenv:     func(k string) string { return env[k] },
		HomeDir:    func() (string, error) { return l.home, nil },
		Executable: func() (string, error) { return filepath.Join(l.bin, "iii"), nil },
		GOOS:       "linux", GOARCH: "amd64",
	}
}

func touch(t *testing.T, path string, mode os.FileMode) string {
	t.Helper()
	assert.NilError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	assert.NilError(t, os.WriteFile(path, []byte("#!/bin/sh\n"), mode))
	return path
}

func TestFindOrder(t *testing.T) {
	const name = "sandbox-x"
	for _, tc := range []struct {
		desc  string
		setup func(t *testing.T, l layout) (env map[string]string, want string)
	}{
		{"package cache first, highest version with the binary", func(t *testing.T, l layout) (map[string]string, string) {
			touch(t, filepath.Join(l.cache, name+"-0.2.9-x86_64-unknown-linux-gnu", name), 0o755)
			want := touch(t, filepath.Join(l.cache, name+"-0.10.0-x86_64-unknown-linux-gnu", "bin", name), 0o755)
			// Higher, but without an executable, for another host, or
			// not a version: all skipped.
			touch(t, filepath.Join(l.cache, name+"-0.11.0-x86_64-unknown-linux-gnu", "README"), 0o644)
			touch(t, filepath.Join(l.cache, name+"-0.12.0-x86_64-unknown-linux-gnu", name), 0o644)
			touch(t, filepath.Join(l.cache, name+"-9.0.0-aarch64-apple-darwin", name), 0o755)
			touch(t, filepath.Join(l.cache, name+"-latest-x86_64-unknown-linux-gnu", name), 0o755)
			touch(t, filepath.Join(l.home, ".iii", "plugins", name), 0o755)
			return map[string]string{EnvComposeStateDir: filepath.Dir(l.cache)}, want
		}},
		{"prerelease versions order below their release", func(t *testing.T, l layout) (map[string]string, string) {
			touch(t, filepath.Join(l.cache, name+"-0.3.0-rc.1-x86_64-unknown-linux-musl", name), 0o755)
			want := touch(t, filepath.Join(l.cache, name+"-0.3.0-x86_64-unknown-linux-gnu", name), 0o755)
			return map[string]string{EnvComposeStateDir: filepath.Dir(l.cache)}, want
		}},
		{"default cache under the home directory", func(t *testing.T, l layout) (map[string]string, string) {
			want := touch(t, filepath.Join(l.home, ".iii", "compose", "packages", name+"-1.0.0-x86_64-unknown-linux-gnu", name), 0o755)
			return nil, want
		}},
		{"binary nested too deep in a package is not found", func(t *testing.T, l layout) (map[string]string, string) {
			touch(t, filepath.Join(l.cache, name+"-1.0.0-x86_64-unknown-linux-gnu", "a", "b", "c", name), 0o755)
			want := touch(t, filepath.Join(l.home, ".iii", "plugins", name), 0o755)
			return map[string]string{EnvComposeStateDir: filepath.Dir(l.cache)}, want
		}},
		{"then ~/.iii/plugins", func(t *testing.T, l layout) (map[string]string, string) {
			want := touch(t, filepath.Join(l.home, ".iii", "plugins", name), 0o755)
			touch(t, filepath.Join(l.pathA, name), 0o755)
			return map[string]string{EnvPluginPath: l.pathA}, want
		}},
		{"then $III_PLUGIN_PATH in order, skipping relative and non-executable entries", func(t *testing.T, l layout) (map[string]string, string) {
			touch(t, filepath.Join(l.pathA, name), 0o644)
			want := touch(t, filepath.Join(l.pathB, name), 0o755)
			touch(t, filepath.Join(l.bin, name), 0o755)
			return map[string]string{EnvPluginPath: "relative/dir" + string(os.PathListSeparator) + l.pathA + string(os.PathListSeparator) + l.pathB}, want
		}},
		{"then beside iii", func(t *testing.T, l layout) (map[string]string, string) {
			return nil, touch(t, filepath.Join(l.bin, name), 0o755)
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			l := newLayout(t)
			env, want := tc.setup(t, l)
			got, err := l.finder(env).Find(name, "")
			assert.NilError(t, err)
			assert.Equal(t, got, want)
		})
	}
}

func TestFindExplicitAndMissing(t *testing.T) {
	l := newLayout(t)
	f := l.finder(nil)
	exe := touch(t, filepath.Join(l.root, "custom", "adapter"), 0o755)
	got, err := f.Find("sandbox-x", exe)
	assert.NilError(t, err)
	assert.Equal(t, got, exe, "an explicit path wins and needs no particular name")

	_, err = f.Find("sandbox-x", "custom/adapter")
	assert.ErrorContains(t, err, "must be absolute")
	_, err = f.Find("sandbox-x", touch(t, filepath.Join(l.root, "plain"), 0o644))
	assert.ErrorContains(t, err, "not an executable file")
	_, err = f.Find("sandbox-x", l.root)
	assert.ErrorContains(t, err, "not an executable file", "a directory is not a binary")

	_, err = f.Find("sandbox-x", "")
	var nf *NotFoundError
	assert.Assert(t, errors.As(err, &nf))
	assert.Equal(t, len(nf.Searched), 3, "cache, ~/.iii/plugins, beside iii: %v", nf.Searched)
	assert.Check(t, is.Contains(err.Error(), filepath.Join(l.home, ".iii", "plugins", "sandbox-x")))
	assert.Check(t, is.Contains(err.Error(), "$"+EnvPluginPath))
}

func TestHostTargets(t *testing.T) {
	assert.DeepEqual(t, hostTargets("linux", "arm64"), []string{"aarch64-unknown-linux-gnu", "aarch64-unknown-linux-musl"})
	assert.DeepEqual(t, hostTargets("darwin", "arm64"), []string{"aarch64-apple-darwin"})
	assert.Assert(t, hostTargets("windows", "amd64") == nil)
	assert.Assert(t, hostTargets("linux", "riscv64") == nil)
}

func TestParsePackageDir(t *testing.T) {
	targets := hostTargets("linux", "amd64")
	for _, tc := range []struct {
		dir, want string
	}{
		{"sandbox-libkrun-0.2.2-x86_64-unknown-linux-gnu", "0.2.2"},
		{"sandbox-libkrun-0.3.0-rc.1-x86_64-unknown-linux-gnu", "0.3.0-rc.1"},
		{"sandbox-libkrun-1.0.0+build.5-x86_64-unknown-linux-musl", "1.0.0+build.5"},
		{"sandbox-libkrun-0.2.2-aarch64-apple-darwin", ""},
		{"sandbox-libkrun-x86_64-unknown-linux-gnu", ""},
		{"sandbox-libkrun--x86_64-unknown-linux-gnu", ""},
		{"sandbox-libkrunner-0.1.0-x86_64-unknown-linux-gnu", ""},
		{"sandbox-libkrun-0.2.2-bundle", ""},
		{"sandbox-libkrun-not.a.version-x86_64-unknown-linux-gnu", ""},
	} {
		v, ok := parsePackageDir(tc.dir, "sandbox-libkrun", targets)
		if tc.want == "" {
			assert.Check(t, !ok, "%s", tc.dir)
			continue
		}
		assert.Assert(t, ok, "%s", tc.dir)
		assert.Equal(t, v.Original(), tc.want)
	}
}

func FuzzParsePackageDir(f *testing.F) {
	for _, s := range []string{"a-0.1.0-x86_64-unknown-linux-gnu", "a-1-x86_64-apple-darwin", "a--", "a-0.3.0-rc.1-aarch64-unknown-linux-gnu", ""} {
		f.Add(s, "a")
	}
	targets := append(hostTargets("linux", "amd64"), hostTargets("darwin", "arm64")...)
	f.Fuzz(func(t *testing.T, dir, name string) {
		v, ok := parsePackageDir(dir, name, targets)
		if !ok {
			return
		}
		if v == nil || !strings.HasPrefix(dir, name+"-") {
			t.Fatalf("accepted %q for %q", dir, name)
		}
	})
}
