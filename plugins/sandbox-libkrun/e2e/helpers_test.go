package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/iii-sandbox/iii/contract"
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
	logs     *lockedBuffer
}

// baseConfig is what every test adapter gets: the python preset allowed,
// the shared cache, and a state directory of the test's own.
func baseConfig(e *env, stateDir string) map[string]any {
	return map[string]any{
		"image_allowlist": []any{"python"},
		"state_dir":       stateDir,
		"cache_dir":       e.cacheDir,
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
	logs := &lockedBuffer{}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake(),
		VersionedPlugins: contract.VersionedPlugins(nil),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		StartTimeout:     time.Minute,
		Stderr:           logs,
		Logger:           hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}),
	})
	t.Cleanup(func() {
		client.Kill()
		if t.Failed() {
			t.Logf("adapter log:\n%s", logs.String())
		}
	})
	rpc, err := client.Client()
	if err != nil {
		return nil, err
	}
	raw, err := rpc.Dispense(contract.PluginName)
	if err != nil {
		return nil, err
	}
	a := raw.(contract.Adapter)
	b, _ := json.Marshal(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Configure(ctx, b); err != nil {
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

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// hostProc is a process on the host.
type hostProc struct {
	pid  int
	args []string
}

// procsUnder lists the live host processes whose command line mentions
// dir: VM runners (their argv names their state directory) and QEMUs
// (their sockets and logs are in it).
func procsUnder(dir string) []hostProc {
	des, _ := os.ReadDir("/proc")
	var out []hostProc
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue // gone, or a zombie
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		for _, a := range args[1:] {
			if strings.Contains(a, dir) {
				out = append(out, hostProc{pid: pid, args: args})
				break
			}
		}
	}
	return out
}

// entries lists what is in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
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
	return string(b)
}
