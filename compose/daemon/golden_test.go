package daemon

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/registry"
)

var (
	uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	pidRE  = regexp.MustCompile(`pid \d+`)
	shaRE  = regexp.MustCompile(`[0-9a-f]{64}`)
)

// normalize makes a message stable across runs.
func normalizeMessage(msg string, repl ...string) string {
	for i := 0; i+1 < len(repl); i += 2 {
		if repl[i] != "" {
			msg = strings.ReplaceAll(msg, repl[i], repl[i+1])
		}
	}
	for _, reg := range []string{fixtures.empty, fixtures.registry} {
		if reg != "" {
			msg = strings.ReplaceAll(msg, reg, "$REGISTRY")
		}
	}
	msg = strings.ReplaceAll(msg, testTarget(), "$TARGET")
	msg = shaRE.ReplaceAllString(msg, "$$SHA256")
	msg = uuidRE.ReplaceAllString(msg, "$$UUID")
	msg = pidRE.ReplaceAllString(msg, "pid $$PID")
	return msg
}

// upError brings dir's project up and returns its first container error.
func upError(t *testing.T, c *client.Client, ns string, payload any) error {
	t.Helper()
	var up opResult
	if err := call(t, c, ns, "compose::up", payload, &up); err != nil {
		return err
	}
	for _, cr := range up.Containers {
		if cr.Error != nil {
			return compose.New(cr.Error.Code, cr.Error.Message)
		}
	}
	t.Fatalf("compose::up did not fail: %+v", up)
	return nil
}

// Every error message this daemon writes for the codes of spec §5.11 it
// owns, checked against testdata/errors/*.golden (go test -update
// rewrites them). Paths, addresses, ids and pids are normalised.
func TestErrorMessagesGolden(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, "")
	c := eng.caller(t)
	type scenario struct {
		name string
		run  func(t *testing.T) (error, []string)
	}
	// A daemon in an empty working directory, for the argument errors.
	empty := t.TempDir()
	if real, err := filepath.EvalSymlinks(empty); err == nil {
		empty = real
	}
	startDaemon(t, eng.attach(Options{Cwd: empty, Namespace: "golden"}))
	in := func(ns, fn string, payload any) error { return call(t, c, ns, fn, payload, nil) }

	// A project whose containers each fail in their own way.
	proj := func(t *testing.T, body string, dirs ...string) string {
		return newProject(t, "namespace: gp\ncontainers:\n"+body, dirs...)
	}
	upIn := func(t *testing.T, dir string) error {
		ns := "gp"
		startDaemon(t, eng.attach(Options{Cwd: dir}))
		return upError(t, c, ns, nil)
	}
	scenarios := []scenario{
		{"WRONG_DAEMON", func(t *testing.T) (error, []string) {
			return in("golden", "compose::status", map[string]any{"namespace": "other"}), nil
		}},
		{"NO_COMPOSE_FILE", func(t *testing.T) (error, []string) {
			return in("golden", "compose::up", nil), []string{empty, "$DAEMON_CWD"}
		}},
		{"NO_COMPOSE_FILE_add", func(t *testing.T) (error, []string) {
			return in("golden", "compose::add", map[string]any{"worker": "iii-sandbox"}), []string{empty, "$DAEMON_CWD"}
		}},
		{"COMPOSE_FILE_UNREADABLE", func(t *testing.T) (error, []string) {
			return in("golden", "compose::up", map[string]any{"file": "deploy/worker-compose.yaml"}), []string{empty, "$DAEMON_CWD"}
		}},
		{"INVALID_ARGUMENT", func(t *testing.T) (error, []string) {
			return in("golden", "compose::logs", map[string]any{"tail": "many"}), nil
		}},
		{"INVALID_WORKER_SPEC", func(t *testing.T) (error, []string) {
			return in("golden", "compose::add", map[string]any{"worker": "path://"}), nil
		}},
		{"UNKNOWN_CONTAINER", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { run: 'sleep 300' }\n", "w")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return in("gp", "compose::up", map[string]any{"container": "nope"}), []string{dir, "$DIR"}
		}},
		{"UNKNOWN_PROJECT", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { run: 'sleep 300' }\n", "w")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return in("gp", "compose::restart", map[string]any{"worker": "w"}), []string{dir, "$DIR"}
		}},
		{"ENGINE_SECTION_REQUIRES_MANAGED_START", func(t *testing.T) (error, []string) {
			dir := newProject(t, "namespace: gp\nengine:\n  workers: {}\ncontainers: {}\n")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return in("gp", "compose::up", nil), []string{dir, "$DIR", eng.url, "$URL"}
		}},
		{"NOT_A_PACKAGE_CONTAINER", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { run: 'sleep 300' }\n", "w")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return in("gp", "compose::update", map[string]any{"worker": "w"}), nil
		}},
		{"PACKAGE_NOT_RESOLVED_update", func(t *testing.T) (error, []string) {
			dir := proj(t, "  state:\n    worker: package://state\n    version: '0.21.4'\n")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return in("gp", "compose::update", nil), nil
		}},
		{"PACKAGE_NOT_RESOLVED_up", func(t *testing.T) (error, []string) {
			return upIn(t, proj(t, "  state:\n    worker: package://state\n    version: '0.21.4'\n")), nil
		}},
		{"PACKAGE_NOT_RESOLVED_add", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { run: 'sleep 300' }\n", "w")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return in("gp", "compose::add", map[string]any{"worker": "state@next"}), nil
		}},
		{"WORKER_SOURCE_CHANGED", func(t *testing.T) (error, []string) {
			dir := proj(t, "  sandbox-libkrun:\n    worker: path://./s\n    scripts: { run: 'sleep 300' }\n", "s")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return in("gp", "compose::add", map[string]any{"worker": "iii-sandbox"}), []string{dir, "$DIR"}
		}},
		{"CHILD_EXITED_BEFORE_REGISTRATION", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { run: 'echo \"\\033[31mno engine here\\033[0m\" >&2; exit 2' }\n", "w")
			return upIn(t, dir), nil
		}},
		{"STARTUP_TIMEOUT", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    startup_timeout: 2s\n    scripts: { run: 'echo waiting; sleep 300' }\n", "w")
			return upIn(t, dir), nil
		}},
		{"SPAWN_FAILED", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    working_dir: ./gone\n    scripts: { run: 'true' }\n", "w")
			return upIn(t, dir), []string{dir, "$DIR"}
		}},
		{"HOOK_SPAWN_FAILED", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    working_dir: ./gone\n    scripts: { pre_run: 'true', run: 'true' }\n", "w")
			return upIn(t, dir), []string{dir, "$DIR"}
		}},
		{"HOOK_FAILED", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { pre_run: 'echo no database >&2; exit 1', run: 'true' }\n", "w")
			return upIn(t, dir), nil
		}},
		{"HOOK_TIMEOUT", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { pre_run: 'sleep 30', pre_run_timeout: 200ms, run: 'true' }\n", "w")
			return upIn(t, dir), nil
		}},
		{"MISSING_START_COMMAND", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n", "w")
			return upIn(t, dir), []string{dir, "$DIR"}
		}},
		{"MISSING_WORKER_DIRECTORY", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { run: 'true' }\n")
			return upIn(t, dir), []string{dir, "$DIR"}
		}},
		{"INVALID_MANIFEST", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n", "w")
			writeFile(t, dir, "w/iii.worker.yaml", "scripts: [start\n")
			return upIn(t, dir), []string{dir, "$DIR"}
		}},
		{"CONTAINER_NAME_TAKEN", func(t *testing.T) (error, []string) {
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			sq, err := client.Dial(ctx, eng.url, client.Options{Name: "taken", Namespace: "gp", IgnoreEnv: true, ConfirmRegistration: true,
				Reconnect: client.ReconnectPolicy{Disable: true}})
			assert.NilError(t, err)
			defer sq.Close(context.Background())
			return upIn(t, proj(t, "  taken:\n    worker: path://./taken\n    scripts: { run: 'true' }\n", "taken")), nil
		}},
		{"RESERVED_ENV_OVERRIDE", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    env_file: [./w.env]\n    scripts: { run: 'true' }\n", "w")
			writeFile(t, dir, "w.env", "OK=1\n")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			// The env file changes after validation: it is read again at start.
			writeFile(t, dir, "w.env", "III_URL=ws://elsewhere\n")
			return upError(t, c, "gp", nil), []string{dir, "$DIR"}
		}},
		{"STATE_DIR_UNAVAILABLE", func(t *testing.T) (error, []string) {
			// The first daemon loads the project (its start fails at once,
			// the project stays loaded and locked).
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { run: 'exit 1' }\n", "w")
			other := startEngine(t, "")
			startDaemon(t, other.attach(Options{Cwd: dir}))
			oc := other.caller(t)
			assert.NilError(t, call(t, oc, "gp", "compose::up", nil, nil))
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return in("gp", "compose::up", nil), []string{dir, "$DIR"}
		}},
		{"INVALID_STATE_FILE", func(t *testing.T) (error, []string) {
			dir := proj(t, "  w:\n    worker: path://./w\n    scripts: { run: 'sleep 300' }\n", "w")
			writeFile(t, dir, ".iii/compose/gp/state.json", `{"version":1,"compose_path":"x","containers":{"w":{"status":"running"}}}`)
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return in("gp", "compose::up", nil), []string{dir, "$DIR"}
		}},
		{"DAEMON_ALREADY_SERVING", func(t *testing.T) (error, []string) {
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			err := Run(ctx, eng.attach(Options{Cwd: empty, Namespace: "golden", Logger: nil}))
			return err, []string{eng.url, "$URL"}
		}},
		{"SANDBOX_ADAPTER_NOT_DECLARED", func(t *testing.T) (error, []string) {
			dir := newProject(t, "namespace: gp\nengine:\n  sandbox: { adapter: sandbox-libkrun }\ncontainers: {}\n")
			f, err := composefile.Load(filepath.Join(dir, "worker-compose.yaml"), nil)
			assert.NilError(t, err)
			return adapterNotDeclared(f, nil, true), []string{dir, "$DIR"}
		}},
	}
	// The package codes: a project with one package container, on a
	// registry and platform of the scenario's choosing.
	pkgUp := func(t *testing.T, body string, po PackageOptions, frozen bool) (error, []string) {
		dir := proj(t, body)
		startDaemon(t, eng.attach(Options{Cwd: dir, Packages: po}))
		var payload any
		if frozen {
			payload = map[string]any{"frozen": true}
		}
		return upError(t, c, "gp", payload), []string{dir, "$DIR"}
	}
	pkgScenario := func(name, body string, po func(t *testing.T) PackageOptions, frozen bool) scenario {
		return scenario{name, func(t *testing.T) (error, []string) { return pkgUp(t, body, po(t), frozen) }}
	}
	published := func(t *testing.T) PackageOptions { return PackageOptions{Registry: publishedRegistry(t)} }
	onPlatform := func(p registry.Platform) func(t *testing.T) PackageOptions {
		return func(t *testing.T) PackageOptions { return PackageOptions{Registry: publishedRegistry(t), Platform: &p} }
	}
	state := "  state:\n    worker: package://state\n    version: '0.21.4'\n"
	scenarios = append(scenarios,
		pkgScenario("COMPOSE_LOCK_REQUIRED", state, published, true),
		scenario{"COMPOSE_LOCK_OUT_OF_DATE", func(t *testing.T) (error, []string) {
			dir := proj(t, state+"  w:\n    worker: path://./w\n", "w")
			writeFile(t, dir, "worker-compose.lock", "version: 1\ncontainers:\n  state:\n    worker: package://state\n    requested: '0.21.3'\n"+
				"    resolved: {name: state, version: 0.21.3, type: binary, artifacts: {x: {url: s.tar.gz, sha256: '"+strings.Repeat("a", 64)+"'}}}\n"+
				"  gone:\n    worker: package://gone\n    requested: '1'\n    resolved: {name: gone, version: 1.0.0, type: binary, artifacts: {x: {url: g, sha256: '"+strings.Repeat("b", 64)+"'}}}\n")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return upError(t, c, "gp", map[string]any{"frozen": true}), []string{dir, "$DIR"}
		}},
		scenario{"INVALID_COMPOSE_LOCK", func(t *testing.T) (error, []string) {
			dir := proj(t, state)
			writeFile(t, dir, "worker-compose.lock", "version: 2\ncontainers: {}\n")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return upError(t, c, "gp", nil), []string{dir, "$DIR"}
		}},
		scenario{"SANDBOX_ADAPTER_NOT_DECLARED_vm", func(t *testing.T) (error, []string) {
			dir := proj(t, "  vmw:\n    worker: path://./vmw\n", "vmw")
			writeFile(t, dir, "vmw/iii.worker.yaml", "runtime:\n  base_image: python\n")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			return upError(t, c, "gp", map[string]any{"frozen": true}), []string{dir, "$DIR"}
		}},
		pkgScenario("REGISTRY_UNREACHABLE", state, func(*testing.T) PackageOptions { return PackageOptions{Registry: "http://127.0.0.1:1/"} }, false),
		pkgScenario("ENGINE_WORKER_IS_BUILTIN", "  configuration:\n    worker: package://configuration\n    version: latest\n", published, false),
		pkgScenario("UNSUPPORTED_PACKAGE_KIND", "  img:\n    worker: package://img\n    version: '*'\n", published, false),
		pkgScenario("UNSUPPORTED_PLATFORM", "  sandbox-hostdir:\n    worker: package://sandbox-hostdir\n    version: '^1'\n",
			onPlatform(registry.Platform{GOOS: "linux", GOARCH: "amd64", Musl: true}), false),
		pkgScenario("UNSUPPORTED_PLATFORM_intel_mac", "  sandbox-hostdir:\n    worker: package://sandbox-hostdir\n    version: '^1'\n",
			onPlatform(registry.Platform{GOOS: "darwin", GOARCH: "amd64"}), false),
		// Supported hosts: a project with a VM worker needs sandbox-libkrun,
		// which Compose adds; on a musl host it has no artefact.
		scenario{"UNSUPPORTED_PLATFORM_vm_worker", func(t *testing.T) (error, []string) {
			dir := proj(t, "  vmw:\n    worker: path://./vmw\n", "vmw")
			writeFile(t, dir, "vmw/iii.worker.yaml", "runtime:\n  base_image: python\n")
			musl := registry.Platform{GOOS: "linux", GOARCH: "amd64", Musl: true}
			startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: publishedRegistry(t), Platform: &musl}}))
			return upError(t, c, "gp", nil), []string{dir, "$DIR", testTarget(), "$TARGET"}
		}},
		pkgScenario("BUNDLE_NEEDS_A_VM", "  bnd:\n    worker: package://bnd\n    version: '1.0.0'\n    runtime: host\n",
			onPlatform(registry.Platform{GOOS: "windows", GOARCH: "amd64"}), false),
		pkgScenario("RUNTIME_REQUIRES_BUNDLE", "  go-worker:\n    worker: package://go-worker\n    version: '1.0.0'\n    runtime: host\n", published, false),
		scenario{"PACKAGE_DIGEST_MISMATCH", func(t *testing.T) (error, []string) {
			reg := registryCopy(t)
			art := filepath.Join(reg, "packages", "go-worker", "1.0.0", "go-worker-1.0.0-"+testTarget()+".tar.gz")
			assert.NilError(t, os.Remove(art))
			assert.NilError(t, os.WriteFile(art, []byte("not what was published"), 0o644))
			err, repl := pkgUp(t, "  go-worker:\n    worker: package://go-worker\n    version: '1.0.0'\n", PackageOptions{Registry: reg}, false)
			return err, append(repl, reg, "$REGISTRY")
		}},
		scenario{"PACKAGE_ARTIFACT_EMPTY", func(t *testing.T) (error, []string) {
			reg := registryCopy(t)
			_, err := registry.Publish(reg, registry.Publication{Name: "docs", Kind: registry.KindBinary, Version: "1.0.0", Target: testTarget(),
				Files: []registry.PublishFile{{Path: writeTemp(t, "README", "only text")}}})
			assert.NilError(t, err)
			err, repl := pkgUp(t, "  docs:\n    worker: package://docs\n    version: '1.0.0'\n", PackageOptions{Registry: reg}, false)
			return err, append(repl, reg, "$REGISTRY")
		}},
	)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			err, repl := sc.run(t)
			assert.Assert(t, err != nil, "no error")
			code := codeOf(err)
			text := normalizeMessage(code+": "+messageOf(err), repl...)
			golden.Assert(t, text+"\n", filepath.Join("errors", sc.name+".golden"))
			assert.Check(t, strings.HasPrefix(sc.name, code), "code %s for scenario %s", code, sc.name)
		})
	}
}
