package lockfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
)

const (
	shaA = "1111111111111111111111111111111111111111111111111111111111111111"
	shaB = "2222222222222222222222222222222222222222222222222222222222222222"
)

// sample is a lock with everything the format has: a tag, a range, a
// registry host, two targets, a default configuration of every value
// type, and graphs.
func sample() *Lock {
	cfg, err := ConfigFromJSON([]byte(`{"zeta":true,"alpha":[1,2.5,"0123",null],"nested":{"b":"true","a":{}},"max":32,"text":"a: b"}`))
	if err != nil {
		panic(err)
	}
	return &Lock{
		Containers: map[string]*Entry{
			"state": {Worker: "package://registry.example/state", Requested: "next", Resolved: Resolved{
				Name: "state", Version: "0.22.8", Type: TypeBinary,
				Artifacts: map[string]Artifact{
					"x86_64-unknown-linux-gnu":  {URL: "https://registry.example/state-0.22.8-x86_64-unknown-linux-gnu.tar.gz", SHA256: shaA},
					"aarch64-unknown-linux-gnu": {URL: "0.22.8/state-0.22.8-aarch64-unknown-linux-gnu.tar.gz", SHA256: shaB},
				},
			}},
			"sandbox-libkrun": {Worker: "package://sandbox-libkrun", Requested: "^0.3", Resolved: Resolved{
				Name: "sandbox-libkrun", Version: "0.3.1", Type: TypeBinary,
				Artifacts:     map[string]Artifact{"x86_64-unknown-linux-gnu": {URL: "0.3.1/sandbox-libkrun.tar.gz", SHA256: shaB}},
				DefaultConfig: cfg,
			}},
			"db": {Worker: "package://registry.example/db", Requested: "1.0.0", Resolved: Resolved{
				Name: "db", Version: "1.0.0", Type: TypeBundle,
				Artifacts: map[string]Artifact{"x86_64-unknown-linux-gnu": {URL: "db.tar.gz", SHA256: shaA}},
			}},
		},
		Graphs: map[string][]string{"state": {"state", "db"}},
	}
}

// The encoding is golden, deterministic (whatever the map order), and
// decodes back to the same lock.
func TestEncodeGolden(t *testing.T) {
	data := sample().Encode()
	golden.Assert(t, string(data), "sample.lock.golden")
	for range 20 {
		assert.Equal(t, string(sample().Encode()), string(data))
	}
	l, err := Decode(data, "worker-compose.lock")
	assert.NilError(t, err)
	assert.Equal(t, string(l.Encode()), string(data))
	assert.DeepEqual(t, l.Graphs, map[string][]string{"state": {"db", "state"}})
	assert.Check(t, ConfigEqual(l.Containers["sandbox-libkrun"].Resolved.DefaultConfig, sample().Containers["sandbox-libkrun"].Resolved.DefaultConfig))

	empty := New()
	golden.Assert(t, string(empty.Encode()), "empty.lock.golden")
	back, err := Decode(empty.Encode(), "x")
	assert.NilError(t, err)
	assert.Equal(t, len(back.Containers), 0)
}

// The lock is written atomically with mode 0644, and only when its
// content changes: an unchanged lock keeps its file (same inode).
func TestWriteOnlyOnChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "worker-compose.lock")
	changed, err := Write(path, sample())
	assert.NilError(t, err)
	assert.Check(t, changed)
	st1, err := os.Stat(path)
	assert.NilError(t, err)
	assert.Equal(t, st1.Mode().Perm(), os.FileMode(0o644))

	changed, err = Write(path, sample())
	assert.NilError(t, err)
	assert.Check(t, !changed)
	st2, err := os.Stat(path)
	assert.NilError(t, err)
	assert.Equal(t, st2.Sys().(*syscall.Stat_t).Ino, st1.Sys().(*syscall.Stat_t).Ino, "not rewritten")

	l := sample()
	l.Containers["db"].Resolved.Version = "1.0.1"
	changed, err = Write(path, l)
	assert.NilError(t, err)
	assert.Check(t, changed)
	got, err := Read(path)
	assert.NilError(t, err)
	assert.Equal(t, got.Containers["db"].Resolved.Version, "1.0.1")
	entries, err := os.ReadDir(dir)
	assert.NilError(t, err)
	assert.Equal(t, len(entries), 1, "no temporary file left behind")

	none, err := Read(filepath.Join(dir, "missing.lock"))
	assert.NilError(t, err)
	assert.Check(t, none == nil)
}

func TestPathFor(t *testing.T) {
	assert.Equal(t, PathFor("config/worker-compose.yaml"), "config/worker-compose.lock")
	assert.Equal(t, PathFor("/p/shop.yml"), "/p/shop.lock")
	assert.Equal(t, PathFor("/p/compose"), "/p/compose.lock")
}

// Decoding refuses anything the format does not allow, naming the line.
func TestDecodeRefuses(t *testing.T) {
	good := string(sample().Encode())
	tests := []struct {
		name, data, msg string
	}{
		{"empty", "", "empty"},
		{"not yaml", "version: [", "not valid YAML"},
		{"two documents", "version: 1\ncontainers: {}\n---\nversion: 1\n", "one YAML document"},
		{"version 2", strings.Replace(good, "version: 1", "version: 2", 1), "version must be 1"},
		{"version string", strings.Replace(good, "version: 1", "version: '1'", 1), "version must be 1"},
		{"no version", "containers: {}\n", "version: is missing"},
		{"no containers", "version: 1\n", "containers: is missing"},
		{"unknown top key", good + "extra: 1\n", `unknown key "extra" in the lock`},
		{"duplicate top key", "version: 1\nversion: 1\ncontainers: {}\n", "version twice"},
		{"unknown entry key", strings.Replace(good, "    requested: ^0.3", "    requested: ^0.3\n    pinned: true", 1), `unknown key "pinned"`},
		{"not package", strings.Replace(good, "worker: package://sandbox-libkrun", "worker: path://./x", 1), "must start with package://"},
		{"name mismatch", strings.Replace(good, "name: sandbox-libkrun", "name: other", 1), "must equal the last segment"},
		{"unsafe version", strings.Replace(good, "version: 0.3.1", "version: 0.3.1/../x", 1), "not path-safe"},
		{"not semver", strings.Replace(good, "version: 0.3.1", "version: v0_3", 1), "not a semantic version"},
		{"bad type", strings.Replace(good, "type: bundle", "type: engine", 1), "binary or bundle"},
		{"bad digest", strings.Replace(good, "sha256: \""+shaA+"\"", "sha256: abc", 1), "64 lower-case hex"},
		{"empty url", strings.Replace(good, "url: db.tar.gz", "url: ''", 1), "non-empty string"},
		{"no artifacts", "version: 1\ncontainers:\n  a:\n    worker: package://a\n    requested: '1'\n    resolved: {name: a, version: 1.0.0, type: binary, artifacts: {}}\n", "non-empty mapping"},
		{"alias", "version: 1\ncontainers:\n  a: &x\n    worker: package://a\n", "anchor or alias"},
		{"unsafe key", "version: 1\ncontainers:\n  ../a: {}\n", "not a container key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.data), "/p/worker-compose.lock")
			assert.Equal(t, compose.CodeOf(err), compose.CodeInvalidComposeLock, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.msg))
			assert.Check(t, is.Contains(err.Error(), "/p/worker-compose.lock"))
		})
	}
	withGraph := func(g string) string {
		return strings.Replace(good, "graphs:\n  state: [db, state]\n", g, 1)
	}
	for name, tc := range map[string]struct{ data, msg string }{
		"graph root not locked": {withGraph("graphs:\n  nope: [db]\n"), "every root must be a locked container"},
		"graph node not locked": {withGraph("graphs:\n  state: [state, ghost]\n"), `lists "ghost"`},
		"graph not a list":      {withGraph("graphs:\n  state: db\n"), "list of container keys"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode([]byte(tc.data), "l")
			assert.Equal(t, compose.CodeOf(err), compose.CodeInvalidComposeLock, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.msg))
		})
	}
}

func TestRuntimeChanged(t *testing.T) {
	const target = "x86_64-unknown-linux-gnu"
	a := sample().Containers["sandbox-libkrun"]
	b := sample().Containers["sandbox-libkrun"]
	assert.Check(t, !RuntimeChanged(a, b, target))
	b.Resolved.Artifacts[target] = Artifact{URL: "https://elsewhere/x.tar.gz", SHA256: shaB}
	b.Requested = "0.3.1"
	assert.Check(t, !RuntimeChanged(a, b, target), "a new URL with the same digest is not new content")
	b.Resolved.Artifacts[target] = Artifact{URL: "x", SHA256: shaA}
	assert.Check(t, RuntimeChanged(a, b, target))
	b = sample().Containers["sandbox-libkrun"]
	b.Resolved.DefaultConfig = map[string]any{"max": 1}
	assert.Check(t, RuntimeChanged(a, b, target))
	b = sample().Containers["sandbox-libkrun"]
	b.Resolved.Type = TypeBundle
	assert.Check(t, RuntimeChanged(a, b, target))
	assert.Check(t, ConfigEqual(map[string]any{"a": 1}, map[string]any{"a": 1.0}))
}

// The frozen checks, each with its code and golden message.
func TestCheckFrozenGolden(t *testing.T) {
	dir := t.TempDir()
	load := func(body string) *composefile.File {
		p := filepath.Join(dir, "worker-compose.yaml")
		assert.NilError(t, os.WriteFile(p, []byte(body), 0o644))
		f, err := composefile.Load(p, nil)
		assert.NilError(t, err)
		return f
	}
	declared := "containers:\n  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: '^0.3'\n" +
		"  state:\n    worker: package://registry.example/state\n    version: next\n"
	locked := func() *Lock {
		l := sample()
		delete(l.Containers, "db")
		l.Graphs = nil
		return l
	}
	lockPath := filepath.Join(dir, "worker-compose.lock")
	tests := []struct {
		name string
		file string
		lock *Lock
		code string
	}{
		{"matches", declared, locked(), ""},
		{"no packages no lock", "containers:\n  a:\n    worker: path://.\n", nil, ""},
		{"COMPOSE_LOCK_REQUIRED", declared, nil, compose.CodeComposeLockRequired},
		{"COMPOSE_LOCK_OUT_OF_DATE_missing", declared + "  extra:\n    worker: package://extra\n    version: '1.0.0'\n", locked(), compose.CodeComposeLockOutOfDate},
		{"COMPOSE_LOCK_OUT_OF_DATE_selector", strings.Replace(declared, "'^0.3'", "'^0.2'", 1), locked(), compose.CodeComposeLockOutOfDate},
		{"COMPOSE_LOCK_OUT_OF_DATE_worker", strings.Replace(declared, "package://registry.example/state", "package://state", 1), locked(), compose.CodeComposeLockOutOfDate},
		{"COMPOSE_LOCK_OUT_OF_DATE_undeclared", "containers:\n  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: '^0.3'\n", locked(), compose.CodeComposeLockOutOfDate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := load(tc.file)
			err := CheckFrozen(f, tc.lock, lockPath)
			if tc.code == "" {
				assert.NilError(t, err)
				return
			}
			assert.Equal(t, compose.CodeOf(err), tc.code)
			golden.Assert(t, strings.ReplaceAll(err.Error(), dir, "$DIR")+"\n", filepath.Join("frozen", tc.name+".golden"))
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(sample().Encode())
	f.Add(New().Encode())
	f.Add([]byte("version: 1\ncontainers:\n  a: *x\n"))
	f.Add([]byte("version: 1\ncontainers: {a: {worker: 'package://a', requested: '*', resolved: {name: a, version: 1.0.0, type: binary, artifacts: {t: {url: u, sha256: '" + shaA + "'}}, default_config: [1, {b: ~}]}}}\ngraphs: {a: [a]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := Decode(data, "fuzz.lock")
		if err != nil {
			if compose.CodeOf(err) != compose.CodeInvalidComposeLock {
				t.Fatalf("error without INVALID_COMPOSE_LOCK: %v", err)
			}
			return
		}
		// What decodes encodes, and decodes again to the same bytes.
		enc := l.Encode()
		back, err := Decode(enc, "again")
		if err != nil {
			t.Fatalf("the encoding of a decoded lock does not decode: %v\n%s", err, enc)
		}
		if string(back.Encode()) != string(enc) {
			t.Fatalf("encoding is not stable:\n%s\n---\n%s", enc, back.Encode())
		}
	})
}
