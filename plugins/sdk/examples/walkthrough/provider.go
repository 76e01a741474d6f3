// Package mine is a sandbox adapter whose sandboxes are host directories
// and whose execs are host processes. It isolates NOTHING: code run in it
// runs as the adapter's user. It is the walkthrough of
// docs/writing-an-adapter.md, small enough to read in one sitting and
// complete enough to pass the conformance suite.
package mine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Name is the adapter's worker name: the engine publishes its functions
// as sandbox-mine::<op>, and looks for a binary of this name.
const (
	Name    = "sandbox-mine"
	Version = "0.1.0"
)

// KeyStateDir is the one configuration key this adapter adds to the
// kit's: the directory sandboxes are made in.
const KeyStateDir = "state_dir"

// hostRef starts an image's reference: the host program it stands for.
const hostRef = "host:"

// Provider is the back end: what only this adapter knows how to do. The
// kit (sandboxkit.Manager) does everything else.
type Provider struct {
	log hclog.Logger

	mu       sync.Mutex
	stateDir string
}

var _ sandboxkit.Provider = (*Provider)(nil)

// NewAdapter is the complete adapter: the Provider behind the kit.
func NewAdapter(log hclog.Logger) *sandboxkit.Manager {
	return sandboxkit.New(&Provider{log: log}, sandboxkit.Options{
		Name:               Name,
		Version:            Version,
		Logger:             log,
		ProviderConfigKeys: []string{KeyStateDir},
	})
}

// Presets are the built-in images, in catalog order. Each stands for a
// host program.
func (p *Provider) Presets() []contract.CatalogImage {
	return []contract.CatalogImage{
		{Name: "shell", OCIRef: hostRef + "/bin/sh"},
		{Name: "python", OCIRef: hostRef + "python3"},
	}
}

// Configure gets the keys named in ProviderConfigKeys, raw, once, before
// any Boot. An error rejects the whole configuration: the adapter exits
// and callers get S301 with this text.
func (p *Provider) Configure(_ context.Context, keys map[string]json.RawMessage) error {
	var dir string
	if raw, ok := keys[KeyStateDir]; ok {
		if err := json.Unmarshal(raw, &dir); err != nil || !filepath.IsAbs(dir) {
			return fmt.Errorf("%s must be an absolute directory path, got %s", KeyStateDir, raw)
		}
	} else {
		home, err := os.UserHomeDir()
		if err != nil {
			return fmt.Errorf("no %s and no home directory: %v", KeyStateDir, err)
		}
		dir = filepath.Join(home, ".iii", "sandbox", "mine")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%s: %v", KeyStateDir, err)
	}
	p.mu.Lock()
	p.stateDir = dir
	p.mu.Unlock()
	return nil
}

// Info is merged into adapter::info. An adapter without isolation says
// so, and says which create fields it cannot honour.
func (p *Provider) Info(context.Context) map[string]any {
	return map[string]any{
		"isolation": "none",
		"ignored":   []string{"cpus", "memory_mb", "network"},
	}
}

// Boot starts one sandbox: a private directory with home/ and tmp/.
// spec.CPUs, spec.MemoryMB and spec.Network are ignored (see Info): every
// process gets the host's. A *contract.Error keeps its code; any other
// error is S300.
func (p *Provider) Boot(_ context.Context, spec sandboxkit.BootSpec) (sandboxkit.Sandbox, error) {
	p.mu.Lock()
	stateDir := p.stateDir
	p.mu.Unlock()
	program, ok := strings.CutPrefix(spec.Image.OCIRef, hostRef)
	if !ok {
		return nil, contract.NewError(contract.S101, "image %s is %q; this adapter runs only host programs (host:<program>)", spec.Image.Name, spec.Image.OCIRef)
	}
	if _, err := lookPath(program, os.Getenv("PATH")); err != nil {
		return nil, contract.NewError(contract.S101, "image %s needs the host's %s, which is not installed", spec.Image.Name, program)
	}
	dir := filepath.Join(stateDir, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	sb, err := newSandbox(spec, dir)
	if err != nil {
		_ = removeAll(dir)
		return nil, err
	}
	p.log.Info("sandbox started", "sandbox_id", spec.ID, "dir", dir)
	return sb, nil
}
