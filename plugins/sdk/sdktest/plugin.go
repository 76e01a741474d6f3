package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/iii-sandbox/iii/contract"
)

// BuildPlugin builds the adapter binary of pkg (a package path such as
// "./cmd/sandbox-mine", relative to the test's directory) into a
// temporary directory and returns its path.
func BuildPlugin(t testing.TB, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// PluginOptions start an adapter binary as a go-plugin subprocess.
type PluginOptions struct {
	// Path is the adapter binary.
	Path string
	// Env is added to the test's environment for the adapter.
	Env []string
	// Config is handed to the adapter's Configure as JSON.
	Config map[string]any
}

// StartPlugin starts the adapter binary as a real go-plugin subprocess,
// exactly as the engine's plugin host would (the contract's handshake and
// versioned plugin set, gRPC with automatic mTLS), configures it, and
// returns a Caller that talks to it through the contract's gRPC client.
// The adapter is shut down when the test ends; its log is printed if the
// test failed.
func StartPlugin(t testing.TB, opts PluginOptions) *AdapterCaller {
	t.Helper()
	cmd := exec.Command(opts.Path)
	cmd.Env = append(os.Environ(), opts.Env...)
	logs := &lockedBuffer{}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake(),
		VersionedPlugins: contract.VersionedPlugins(nil),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		StartTimeout:     time.Minute,
		Stderr:           logs,
		Logger:           hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Warn}),
	})
	t.Cleanup(func() {
		client.Kill()
		if t.Failed() {
			t.Logf("adapter %s log:\n%s", filepath.Base(opts.Path), logs.String())
		}
	})
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("start adapter %s: %v\n%s", opts.Path, err, logs.String())
	}
	raw, err := rpc.Dispense(contract.PluginName)
	if err != nil {
		t.Fatalf("dispense the sandbox plugin: %v", err)
	}
	adapter, ok := raw.(contract.Adapter)
	if !ok {
		t.Fatalf("the sandbox plugin dispensed %T, not a contract.Adapter", raw)
	}
	cfg, err := json.Marshal(opts.Config)
	if err != nil {
		t.Fatalf("marshal the adapter configuration: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := adapter.Configure(ctx, cfg); err != nil {
		t.Fatalf("configure the adapter with %s: %v\n%s", cfg, err, logs.String())
	}
	return NewAdapterCaller(adapter)
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
