// Command sandbox-althost is a second, test-only sandbox adapter built with
// the SDK, so tests can swap adapters by name: like the hostdir example its
// sandboxes are host directories (NO isolation), but every exec finds its
// interpreters first in a directory of its own, where python3 and node are
// shims that exec the host's programs, so code runs through a different
// interpreter path. adapter::info reports that directory, and the shims
// set ALTHOST_VIA to the path they ran as.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

const name = "sandbox-althost"

func main() {
	sdk.Serve(sdk.ServeConfig{
		Name:    name,
		Version: "0.0.1-test",
		New: func(_ context.Context, log hclog.Logger) (contract.Adapter, error) {
			bin, err := os.MkdirTemp("", "sandbox-althost-bin-")
			if err != nil {
				return nil, err
			}
			p := &provider{Provider: hostdir.NewProvider(log), bin: bin}
			return &adapter{
				Manager: sandboxkit.New(p, sandboxkit.Options{
					Name: name, Version: "0.0.1-test", Logger: log,
					ProviderConfigKeys: []string{hostdir.KeyStateDir},
				}),
				bin: bin,
			}, nil
		},
	})
}

// adapter removes the interpreter directory when it shuts down.
type adapter struct {
	*sandboxkit.Manager
	bin string
}

func (a *adapter) Shutdown(ctx context.Context) error {
	err := a.Manager.Shutdown(ctx)
	_ = os.RemoveAll(a.bin)
	return err
}

type provider struct {
	*hostdir.Provider
	bin string
}

func (p *provider) Presets() []contract.CatalogImage {
	return []contract.CatalogImage{
		{Name: "python", OCIRef: "host:python3"},
		{Name: "shell", OCIRef: "host:/bin/sh"},
	}
}

// Configure writes the adapter's interpreter shims, then configures the
// hostdir provider underneath. Each shim records in ALTHOST_VIA the path
// it was run as and execs the host's program.
func (p *provider) Configure(ctx context.Context, keys map[string]json.RawMessage) error {
	for _, prog := range []string{"python3", "node"} {
		real, err := exec.LookPath(prog)
		if err != nil {
			continue
		}
		if real, err = filepath.Abs(real); err != nil {
			return fmt.Errorf("resolve %s: %v", prog, err)
		}
		shim := fmt.Sprintf("#!/bin/sh\nALTHOST_VIA=\"$0\" exec '%s' \"$@\"\n", real)
		if err := os.WriteFile(filepath.Join(p.bin, prog), []byte(shim), 0o755); err != nil {
			return fmt.Errorf("write the %s shim: %v", prog, err)
		}
	}
	return p.Provider.Configure(ctx, keys)
}

func (p *provider) Info(ctx context.Context) map[string]any {
	facts := p.Provider.Info(ctx)
	facts["interpreter_dir"] = p.bin
	return facts
}

// Boot puts the interpreter directory first on the sandbox's PATH.
func (p *provider) Boot(ctx context.Context, spec sandboxkit.BootSpec) (sandboxkit.Sandbox, error) {
	spec.Env = append([]string{"PATH=" + p.bin + string(os.PathListSeparator) + os.Getenv("PATH")}, spec.Env...)
	return p.Provider.Boot(ctx, spec)
}
