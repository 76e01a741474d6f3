package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/adapterproc"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/procscan"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/plugins/sdk/sdktest"
)

// callTimeout bounds one call: a create under TCG on a loaded two-core
// host can take a while, and the first one installs the image.
const callTimeout = 5 * time.Minute

// proc is a sandbox-libkrun adapter running as a real go-plugin
// subprocess, the way the engine runs it.
type proc struct {
	*sdktest.AdapterCaller
	pid      int
	client   *plugin.Client
	stateDir string
	logs     *syncbuf.Buffer
}

// baseConfig is what every test adapter gets: the python preset allowed,
// the shared cache, and a state directory of the test's own.
func baseConfig(e *env, stateDir string) map[string]any {
	return map[string]any{
		"image_allowlist": []any{"python"},
		"state_dir":       stateDir,
		"cache_dir":       e.cacheDir,
		// VMs end with their adapter here, as most tests check what a
		// stop or a crash leaves; adopt_test.go turns adoption on.
		"adopt_grace_ms": 0,
	}
}

// start runs the adapter with config (merged over baseConfig for
// stateDir) and configures it. It is shut down when the test ends.
func start(t *testing.T, e *env, stateDir string, config map[string]any) *proc {
	t.Helper()
	p, err := startErr(t, e, stateDir, config)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func startErr(t *testing.T, e *env, stateDir string, config map[string]any) (*proc, error) {
	t.Helper()
	cfg := sdktest.Merge(baseConfig(e, stateDir), config)
	cmd := exec.Command(e.bin)
	cmd.Env = os.Environ()
	logs := &syncbuf.Buffer{}
	client := adapterproc.NewClient(adapterproc.Options{Cmd: cmd, Stderr: logs,
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})})
	t.Cleanup(func() {
		client.Kill()
		if t.Failed() {
			t.Logf("adapter log:\n%s", logs.String())
		}
	})
	a, err := adapterproc.Dispense(client)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := adapterproc.Configure(ctx, a, cfg); err != nil {
		return nil, err
	}
	return &proc{AdapterCaller: sdktest.NewAdapterCaller(a), pid: cmd.Process.Pid, client: client, stateDir: stateDir, logs: logs}, nil
}

// call sends op and decodes the reply into out.
func (p *proc) call(t *testing.T, op string, payload, out any) {
	t.Helper()
	raw, err := p.Call(ctxT(t), op, payload)
	if err != nil {
		t.Fatalf("%s %v: %v", op, payload, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: decode %s: %v", op, raw, err)
		}
	}
}

// fail sends op, which must fail with code.
func (p *proc) fail(t *testing.T, op string, payload any, code contract.Code) *contract.Error {
	t.Helper()
	_, err := p.Call(ctxT(t), op, payload)
	var se *contract.Error
	if !errors.As(err, &se) || se.Code != code {
		t.Fatalf("%s %v: want %s, got %v", op, payload, code, err)
	}
	return se
}

// create boots a python sandbox and returns its id.
func (p *proc) create(t *testing.T, extra map[string]any) string {
	t.Helper()
	var out contract.CreateResponse
	p.call(t, contract.OpCreate, sdktest.Merge(map[string]any{"image": "python"}, extra), &out)
	if out.SandboxID == "" {
		t.Fatal("create returned no sandbox_id")
	}
	return out.SandboxID
}

func (p *proc) stop(t *testing.T, id string) {
	t.Helper()
	p.call(t, contract.OpStop, map[string]any{"sandbox_id": id, "wait": true}, nil)
}

// exec runs argv in the sandbox.
func (p *proc) exec(t *testing.T, id string, argv ...string) contract.ExecResponse {
	t.Helper()
	var out contract.ExecResponse
	p.call(t, contract.OpExec, map[string]any{"sandbox_id": id, "argv": argv}, &out)
	return out
}

// sh runs a /bin/sh script in the sandbox and returns its stdout, failing
// unless it exits 0.
func (p *proc) sh(t *testing.T, id, script string) string {
	t.Helper()
	out := p.exec(t, id, "/bin/sh", "-c", script)
	if !out.Success {
		t.Fatalf("sh -c %q: exit %v, stderr %q", script, out.ExitCode, out.Stderr)
	}
	return out.Stdout
}

// info returns adapter::info.
func (p *proc) info(t *testing.T) map[string]any {
	t.Helper()
	var out map[string]any
	p.call(t, contract.OpAdapterInfo, nil, &out)
	return out
}

// procsUnder lists the live host processes whose arguments (argv[0]
// aside) mention dir: VM runners (their argv names their state directory)
// and QEMUs (their sockets and logs are in it).
func procsUnder(dir string) []procscan.Proc {
	var out []procscan.Proc
	for _, p := range procscan.Live() {
		if slices.ContainsFunc(p.Args[1:], func(a string) bool { return strings.Contains(a, dir) }) {
			out = append(out, p)
		}
	}
	return out
}

// sandboxDirs lists state_dir's entries other than the snapshot templates'
// directory, which outlives sandboxes and adapters by design.
func sandboxDirs(t *testing.T, stateDir string) []string {
	t.Helper()
	var out []string
	for _, n := range dirs.Names(t, stateDir) {
		if n != "templates" {
			out = append(out, n)
		}
	}
	return out
}

// sandboxProcs is procsUnder without the VMs that record snapshot
// templates in the background (state_dir/templates/.vms): they belong to
// the adapter, not to a sandbox.
func sandboxProcs(stateDir string) []procscan.Proc {
	var out []procscan.Proc
	rec := filepath.Join(stateDir, "templates", ".vms")
	for _, p := range procsUnder(stateDir) {
		if !slices.ContainsFunc(p.Args[1:], func(a string) bool { return strings.Contains(a, rec) }) {
			out = append(out, p)
		}
	}
	return out
}

// mounts is the host's mount table, for before/after comparisons.
func mounts(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	// The network namespaces of test hosts (internal/testkit/netns) come
	// and go with the tests that run beside this one: they are not the
	// adapter's.
	var keep []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], "/run/netns/") {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n")
}
