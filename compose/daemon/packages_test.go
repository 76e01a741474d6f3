package daemon

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/lockfile"
)

func readLock(t *testing.T, dir string) *lockfile.Lock {
	t.Helper()
	l, err := lockfile.Read(filepath.Join(dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Assert(t, l != nil, "no lock in %s", dir)
	return l
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	st, err := os.Stat(p)
	assert.NilError(t, err)
	return st.Sys().(*syscall.Stat_t).Ino
}

func readText(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	assert.NilError(t, err)
	return string(b)
}

// adapterPath is the binary the engine's plugin host runs for an adapter.
func adapterPath(t *testing.T, c *client.Client, ns, adapter string) string {
	t.Helper()
	var list struct {
		Adapters []adapterStatus `json:"adapters"`
	}
	assert.NilError(t, call(t, c, "default", "engine::adapters::list", nil, &list))
	for _, a := range list.Adapters {
		if a.Adapter == adapter && a.Namespace == ns {
			return a.Path
		}
	}
	t.Fatalf("adapter %s is not in engine::adapters::list: %+v", adapter, list)
	return ""
}

// A binary package runs as a host process from the verified cache entry,
// with the package's default configuration as the lowest layer. The lock
// is written once and reused without resolving again; a changed selector
// is resolved again; a frozen start with an empty cache downloads from
// the locked URL and writes nothing.
func TestPackageWorkerAndLock(t *testing.T) {
	t.Parallel()
	reg := publishedRegistry(t)
	eng := startEngine(t, "")
	c := eng.caller(t)
	body := "namespace: pk\ncontainers:\n  # A worker from the registry.\n  go-worker:\n    worker: package://go-worker\n    version: '~1.0.0'\n    config_override: { level: 5 }\n"
	dir := newProject(t, body)
	file := filepath.Join(dir, "worker-compose.yaml")
	lockPath := filepath.Join(dir, "worker-compose.lock")
	cache := t.TempDir()
	startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: reg, Cache: cache}}))

	var up opResult
	assert.NilError(t, call(t, c, "pk", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v", up)
	l := readLock(t, dir)
	e := l.Containers["go-worker"]
	assert.Equal(t, e.Worker, "package://go-worker")
	assert.Equal(t, e.Requested, "~1.0.0")
	assert.Equal(t, e.Resolved.Version, "1.0.0")
	assert.Equal(t, e.Resolved.Type, "binary")
	assert.Equal(t, e.Resolved.Artifacts[testTarget()].URL, "1.0.0/go-worker-1.0.0-"+testTarget()+".tar.gz", "the URL as the index writes it")
	assert.DeepEqual(t, e.Resolved.DefaultConfig, map[string]any{"greeting": "hello", "level": 1})
	entry := filepath.Join(cache, "go-worker-1.0.0-"+testTarget())
	_, err := os.Stat(filepath.Join(entry, "go-worker"))
	assert.NilError(t, err, "installed in the cache")
	cfg := readText(t, filepath.Join(dir, ".iii", "compose", "pk", "config", "go-worker.yaml"))
	assert.Check(t, is.Contains(cfg, "greeting: hello"), "package defaults are the lowest layer")
	assert.Check(t, is.Contains(cfg, "level: 5"), "config_override wins")
	assert.Equal(t, readText(t, file), body, "the compose file is not edited")

	// A restart reuses the lock: not written again.
	ino := inode(t, lockPath)
	lockText := readText(t, lockPath)
	var res opResult
	assert.NilError(t, call(t, c, "pk", "compose::restart", nil, &res))
	assert.Equal(t, res.Status, "ok", "%+v", res)
	assert.Equal(t, inode(t, lockPath), ino)

	// Another selector in the file: resolved again at the next restart.
	assert.NilError(t, os.WriteFile(file, []byte(strings.Replace(body, "'~1.0.0'", "'^1'", 1)), 0o644))
	assert.NilError(t, call(t, c, "pk", "compose::restart", nil, &res))
	assert.Equal(t, res.Status, "ok", "%+v", res)
	assert.Equal(t, readLock(t, dir).Containers["go-worker"].Resolved.Version, "1.1.0")
	assert.NilError(t, call(t, c, "pk", "compose::down", nil, nil))

	// Frozen, on another machine's empty cache, with the first lock back.
	assert.NilError(t, os.WriteFile(file, []byte(body), 0o644))
	assert.NilError(t, os.WriteFile(lockPath, []byte(lockText), 0o644))
	ino = inode(t, lockPath)
	other := t.TempDir()
	td := startDaemon(t, eng.attach(Options{Cwd: dir, Namespace: "pk2", Packages: PackageOptions{Registry: reg, Cache: other}}))
	_ = td
	assert.NilError(t, call(t, c, "pk2", "compose::up", map[string]any{"frozen": true}, &up))
	assert.Equal(t, up.Status, "ok", "%+v", up)
	_, err = os.Stat(filepath.Join(other, "go-worker-1.0.0-"+testTarget(), "go-worker"))
	assert.NilError(t, err, "downloaded from the locked URL")
	assert.Equal(t, readText(t, lockPath), lockText)
	assert.Equal(t, inode(t, lockPath), ino, "frozen never writes the lock")
	assert.Equal(t, readText(t, file), body)

	// Frozen with a selector the lock does not have.
	assert.NilError(t, call(t, c, "pk2", "compose::down", nil, nil))
	assert.NilError(t, os.WriteFile(file, []byte(strings.Replace(body, "'~1.0.0'", "'^1'", 1)), 0o644))
	err = call(t, c, "pk2", "compose::up", map[string]any{"frozen": true}, nil)
	assert.Equal(t, codeOf(err), compose.CodeComposeLockOutOfDate, "%v", err)
	assert.Equal(t, inode(t, lockPath), ino)
}

// The 0.26 upgrade guide: a file that declares the adapter at '^0.2'
// stays on 0.2 across compose::up, compose::restart and
// compose::update worker=sandbox-libkrun; a bare compose::update rewrites
// the range to '^0.3' (comments and quoting kept) and updates every other
// package worker, then restarts the project once.
func TestAdapterStaysOnItsRange(t *testing.T) {
	t.Parallel()
	reg := publishedRegistry(t)
	eng := startEngine(t, "sandbox:\n  adapter: sandbox-libkrun\n  namespace: sx\n")
	c := eng.caller(t)
	sd := t.TempDir()
	body := "namespace: sx\ncontainers:\n  # The sandbox adapter, kept on contract 1.0.\n  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n" +
		"    version: '^0.2'   # contract 1.0\n    config_override:\n      state_dir: " + sd + "\n" +
		"  api:\n    worker: package://go-worker\n    version: \"1.0.0\"\n    start_after: [sandbox-libkrun]\n"
	dir := newProject(t, body)
	file := filepath.Join(dir, "worker-compose.yaml")
	startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: reg}}))
	on := func(version string) {
		t.Helper()
		assert.Check(t, is.Contains(adapterPath(t, c, "sx", "sandbox-libkrun"), "sandbox-libkrun-"+version+"-"+testTarget()))
		assert.Equal(t, readLock(t, dir).Containers["sandbox-libkrun"].Resolved.Version, version)
	}

	var op opResult
	assert.NilError(t, call(t, c, "sx", "compose::up", nil, &op))
	assert.Equal(t, op.Status, "ok", "%+v", op)
	on("0.2.9")
	assert.NilError(t, call(t, c, "sx", "compose::restart", nil, &op))
	assert.Equal(t, op.Status, "ok", "%+v", op)
	on("0.2.9")
	assert.NilError(t, call(t, c, "sx", "compose::restart", map[string]any{"worker": "sandbox-libkrun"}, &op))
	assert.Equal(t, op.Status, "ok", "%+v", op)
	on("0.2.9")

	var upd updateResult
	assert.NilError(t, call(t, c, "sx", "compose::update", map[string]any{"worker": "sandbox-libkrun"}, &upd))
	assert.DeepEqual(t, upd.Updated, []updateEntry{{Container: "sandbox-libkrun", From: "0.2.9", To: "0.2.9",
		Detail: "0.2.9 is current; the content did not change, nothing restarts", Changed: false}})
	assert.Check(t, !upd.Restarted)
	assert.Equal(t, readText(t, file), body)
	on("0.2.9")

	assert.NilError(t, call(t, c, "sx", "compose::update", nil, &upd))
	assert.Check(t, upd.Restarted)
	assert.Equal(t, upd.Up.Status, "ok", "%+v", upd.Up)
	assert.DeepEqual(t, upd.Added, []string{"gw-dep"})
	golden.Assert(t, strings.ReplaceAll(readText(t, file), sd, "$STATE"), filepath.Join("packages", "bare-update.golden"))
	on("0.3.1")
	byKey := map[string]updateEntry{}
	for _, u := range upd.Updated {
		byKey[u.Container] = u
	}
	assert.DeepEqual(t, byKey["sandbox-libkrun"], updateEntry{Container: "sandbox-libkrun", From: "0.2.9", To: "0.3.1",
		Detail: "version '^0.2' → '^0.3' in the file; 0.2.9 → 0.3.1", Changed: true})
	assert.DeepEqual(t, byKey["api"], updateEntry{Container: "api", From: "1.0.0", To: "1.1.0",
		Detail: "version '1.0.0' → '1.1.0' in the file; 1.0.0 → 1.1.0", Changed: true})
	assert.Equal(t, byKey["gw-dep"].To, "1.2.0")
	l := readLock(t, dir)
	assert.DeepEqual(t, l.Graphs, map[string][]string{"api": {"api", "gw-dep"}, "sandbox-libkrun": {"sandbox-libkrun"}})
	// The router reaches the adapter now on 0.3 (the catalog needs no VM).
	_, err := c.Call(context.Background(), "sandbox::catalog::list", nil)
	assert.NilError(t, err)
	var st statusReply
	assert.NilError(t, call(t, c, "sx", "compose::status", nil, &st))
	for _, key := range []string{"sandbox-libkrun", "api", "gw-dep"} {
		s, _, _ := st.of(key)
		assert.Equal(t, s, "ready", key)
	}

	// Back to a version without dependencies: the generated gw-dep and
	// the edge to it go; the adapter's declaration stays.
	assert.NilError(t, call(t, c, "sx", "compose::update", map[string]any{"worker": "api@1.0.0"}, &upd))
	assert.DeepEqual(t, upd.Removed, []string{"gw-dep"})
	assert.Check(t, upd.Restarted)
	golden.Assert(t, strings.ReplaceAll(readText(t, file), sd, "$STATE"), filepath.Join("packages", "pinned-back.golden"))
	l = readLock(t, dir)
	assert.Check(t, l.Containers["gw-dep"] == nil)
	assert.DeepEqual(t, l.Graphs, map[string][]string{"api": {"api"}, "sandbox-libkrun": {"sandbox-libkrun"}})
	assert.NilError(t, call(t, c, "sx", "compose::status", nil, &st))
	s, _, _ := st.of("gw-dep")
	assert.Equal(t, s, "", "gw-dep is no container of the project any more")

	err = call(t, c, "sx", "compose::update", map[string]any{"worker": "nope"}, nil)
	assert.Equal(t, codeOf(err), compose.CodeUnknownContainer)
}

// compose::add with registry specs: an unpinned name is written as its
// exact latest version with its registry dependencies (generated,
// start_after edges, engine-kind ones skipped), a tag stays a tag and the
// lock pins it; an engine-kind root is refused. Comments are kept.
func TestAddRegistryPackages(t *testing.T) {
	t.Parallel()
	reg := publishedRegistry(t)
	eng := startEngine(t, "")
	c := eng.caller(t)
	exe, err := os.Executable()
	assert.NilError(t, err)
	body := "# The project.\nnamespace: ad\ncontainers:\n  # A local worker.\n  w:\n    worker: path://./w\n    scripts: { run: '" + exe + " " + goWorkerCommand + "' }\n"
	dir := newProject(t, body, "w")
	file := filepath.Join(dir, "worker-compose.yaml")
	startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: reg}}))
	var up opResult
	assert.NilError(t, call(t, c, "ad", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v", up)

	var add addResult
	assert.NilError(t, call(t, c, "ad", "compose::add", map[string]any{"worker": "go-worker"}, &add))
	assert.DeepEqual(t, add.Added, []string{"go-worker", "gw-dep"})
	assert.Equal(t, add.Up.Status, "ok", "%+v", add.Up)
	golden.Assert(t, strings.ReplaceAll(readText(t, file), exe, "$EXE"), filepath.Join("packages", "add-latest.golden"))
	l := readLock(t, dir)
	assert.Equal(t, l.Containers["go-worker"].Requested, "1.1.0")
	assert.Equal(t, l.Containers["gw-dep"].Requested, "1.2.0")
	assert.DeepEqual(t, l.Graphs, map[string][]string{"go-worker": {"go-worker", "gw-dep"}})

	// A tag stays a tag; the lock pins it. gw-dep becomes a root.
	assert.NilError(t, call(t, c, "ad", "compose::add", map[string]any{"worker": "gw-dep@latest"}, &add))
	assert.DeepEqual(t, add.Changed, []string{"gw-dep"})
	assert.Check(t, is.Contains(readText(t, file), "    version: 'latest'\n"))
	l = readLock(t, dir)
	assert.Equal(t, l.Containers["gw-dep"].Requested, "latest")
	assert.Equal(t, l.Containers["gw-dep"].Resolved.Version, "1.2.0")
	assert.DeepEqual(t, l.Graphs["gw-dep"], []string{"gw-dep"})

	// A no-op edits nothing.
	before := readText(t, file)
	assert.NilError(t, call(t, c, "ad", "compose::add", map[string]any{"worker": "gw-dep@latest"}, &add))
	assert.Check(t, !add.Edited)
	assert.Equal(t, readText(t, file), before)

	err = call(t, c, "ad", "compose::add", map[string]any{"worker": "configuration"}, nil)
	assert.Equal(t, codeOf(err), compose.CodeEngineWorkerIsBuiltin, "%v", err)
	err = call(t, c, "ad", "compose::add", map[string]any{"worker": "nothing-like-it@1"}, nil)
	assert.Equal(t, codeOf(err), compose.CodePackageNotResolved, "%v", err)
	assert.Equal(t, readText(t, file), before, "a failed add changes nothing")
}

// iii compose build (Build): the registry beside the iii binary, with no
// $III_REGISTRY; the adapter a project needs is written into the file;
// --frozen checks and writes nothing.
func TestBuild(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	bin := filepath.Join(root, "bin")
	assert.NilError(t, os.MkdirAll(bin, 0o755))
	assert.NilError(t, os.Symlink(publishedRegistry(t), filepath.Join(bin, "registry")))
	lookup := func(k string) (string, bool) { return "", false }
	body := "namespace: b\nengine:\n  sandbox: { adapter: sandbox-libkrun }\ncontainers:\n  api:\n    worker: package://go-worker\n    version: '1.0.0'\n"
	dir := newProject(t, body)
	file := filepath.Join(dir, "worker-compose.yaml")
	cache := t.TempDir()
	opts := BuildOptions{Cwd: dir, LookupEnv: lookup, Executable: filepath.Join(bin, "iii"), Packages: PackageOptions{Cache: cache}}

	frozen := opts
	frozen.Frozen = true
	_, err := Build(context.Background(), frozen)
	assert.Equal(t, compose.CodeOf(err), compose.CodeSandboxAdapterNotDeclared, "%v", err)
	assert.Equal(t, readText(t, file), body)

	res, err := Build(context.Background(), opts)
	assert.NilError(t, err)
	assert.Equal(t, res.AdapterAdded, "sandbox-libkrun")
	assert.Check(t, res.LockWritten)
	assert.Equal(t, readText(t, file), body+"  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: '^0.3'\n")
	l := readLock(t, dir)
	assert.Equal(t, l.Containers["sandbox-libkrun"].Resolved.Version, "0.3.1")
	for _, e := range []string{"sandbox-libkrun-0.3.1-", "go-worker-1.0.0-"} {
		_, err := os.Stat(filepath.Join(cache, e+testTarget()))
		assert.NilError(t, err)
	}

	// Frozen now matches; from an empty cache it downloads, and writes
	// nothing.
	ino := inode(t, filepath.Join(dir, "worker-compose.lock"))
	frozen.Packages.Cache = t.TempDir()
	res, err = Build(context.Background(), frozen)
	assert.NilError(t, err)
	assert.Check(t, !res.LockWritten)
	assert.Equal(t, inode(t, filepath.Join(dir, "worker-compose.lock")), ino)
	for _, c := range res.Containers {
		assert.Check(t, !c.Reused, c.Container)
	}
	res, err = Build(context.Background(), frozen)
	assert.NilError(t, err)
	for _, c := range res.Containers {
		assert.Check(t, c.Reused, c.Container)
	}

	// No registry at all: beside an iii that has none.
	opts.Executable = filepath.Join(root, "elsewhere", "iii")
	assert.NilError(t, os.WriteFile(file, []byte(body+"  other:\n    worker: package://gw-dep\n    version: '1.0.0'\n"), 0o644))
	_, err = Build(context.Background(), opts)
	assert.Equal(t, compose.CodeOf(err), compose.CodeRegistryUnreachable, "%v", err)
	assert.Check(t, is.Contains(err.Error(), "make build"))
}

// package://<host>/<name> against a real HTTP registry (loopback, so
// plain http): resolved, downloaded over HTTP, verified and run; the lock
// names the registry host in worker and keeps the index's relative URL.
func TestHTTPRegistryHost(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.FileServer(http.Dir(publishedRegistry(t))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	eng := startEngine(t, "")
	c := eng.caller(t)
	dir := newProject(t, "namespace: hr\ncontainers:\n  gw:\n    worker: package://"+host+"/gw-dep\n    version: latest\n")
	cache := t.TempDir()
	startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Cache: cache}}))
	var up opResult
	assert.NilError(t, call(t, c, "hr", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v", up)
	e := readLock(t, dir).Containers["gw"]
	assert.Equal(t, e.Worker, "package://"+host+"/gw-dep")
	assert.Equal(t, e.Requested, "latest")
	assert.Equal(t, e.Resolved.Version, "1.2.0")
	assert.Equal(t, e.Resolved.Artifacts[testTarget()].URL, "1.2.0/gw-dep-1.2.0-"+testTarget()+".tar.gz")
	_, err := os.Stat(filepath.Join(cache, "gw-dep-1.2.0-"+testTarget(), "gw-dep"))
	assert.NilError(t, err)

	// The registry goes away: the locked, cached package still starts
	// (no resolution), a new one cannot be resolved.
	srv.Close()
	var res opResult
	assert.NilError(t, call(t, c, "hr", "compose::restart", nil, &res))
	assert.Equal(t, res.Status, "ok", "%+v", res)
	err = call(t, c, "hr", "compose::update", nil, nil)
	assert.Equal(t, codeOf(err), compose.CodeRegistryUnreachable, "%v", err)
}
