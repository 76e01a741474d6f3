package sdktest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/internal/testkit/adapterproc"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
)

// BuildPlugin builds the adapter binary of pkg (a package path such as
// "./cmd/sandbox-mine", relative to the test's directory) into a
// temporary directory and returns its path.
func BuildPlugin(t testing.TB, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	out, err := bins.GoBuild(bin, pkg, nil)
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
// returns a Caller that hands it each call's JSON through the plugin (adapterrpc).
// The adapter is shut down when the test ends; its log is printed if the
// test failed.
func StartPlugin(t testing.TB, opts PluginOptions) *AdapterCaller {
	t.Helper()
	cmd := exec.Command(opts.Path)
	cmd.Env = append(os.Environ(), opts.Env...)
	logs := &syncbuf.Buffer{}
	client := adapterproc.NewClient(adapterproc.Options{Cmd: cmd, Stderr: logs,
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Warn})})
	t.Cleanup(func() {
		client.Kill()
		if t.Failed() {
			t.Logf("adapter %s log:\n%s", filepath.Base(opts.Path), logs.String())
		}
	})
	adapter, err := adapterproc.Dispense(client)
	if err != nil {
		t.Fatalf("adapter %s: %v\n%s", opts.Path, err, logs.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := adapterproc.Configure(ctx, adapter, opts.Config); err != nil {
		t.Fatalf("configure the adapter with %v: %v\n%s", opts.Config, err, logs.String())
	}
	return NewAdapterCaller(adapter)
}
