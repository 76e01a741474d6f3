package hostdir

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Name and Version identify the adapter.
const (
	Name    = "sandbox-hostdir"
	Version = "0.1.0"
)

// KeyStateDir is hostdir's own configuration key: where sandbox
// directories are made.
const KeyStateDir = "state_dir"

// EnvStateDir overrides the default state directory when state_dir is not
// set.
const EnvStateDir = "III_STATE_DIR"

// defaultPath is the PATH a sandbox gets when the adapter has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// hostRefPrefix starts the reference of a hostdir image: the host program
// it runs.
const hostRefPrefix = "host:"

// Provider is hostdir's sandboxkit.Provider.
type Provider struct {
	log hclog.Logger
	// getenv reads the adapter's environment ($III_STATE_DIR); tests
	// give each provider its own, so that they run side by side.
	getenv func(string) string

	mu       sync.Mutex
	stateDir string
	path     string
}

var _ sandboxkit.Provider = (*Provider)(nil)

// NewProvider returns a hostdir provider logging to log.
func NewProvider(log hclog.Logger) *Provider {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	p := os.Getenv("PATH")
	if p == "" {
		p = defaultPath
	}
	return &Provider{log: log, path: p, getenv: os.Getenv}
}

// NewAdapter is the complete hostdir adapter: the provider behind a
// sandboxkit Manager.
func NewAdapter(log hclog.Logger) *sandboxkit.Manager {
	return sandboxkit.New(NewProvider(log), sandboxkit.Options{
		Name:               Name,
		Version:            Version,
		Logger:             log,
		ProviderConfigKeys: []string{KeyStateDir},
	})
}

// Presets implements sandboxkit.Provider.
func (p *Provider) Presets() []contract.CatalogImage {
	return []contract.CatalogImage{
		{Name: "python", OCIRef: hostRefPrefix + "python3"},
		{Name: "node", OCIRef: hostRefPrefix + "node"},
		{Name: "shell", OCIRef: hostRefPrefix + "/bin/sh"},
	}
}

// Configure implements sandboxkit.Provider: state_dir, an absolute path.
func (p *Provider) Configure(_ context.Context, keys map[string]json.RawMessage) error {
	dir := p.getenv(EnvStateDir)
	if raw, ok := keys[KeyStateDir]; ok {
		if err := json.Unmarshal(raw, &dir); err != nil {
			return fmt.Errorf("key %q must be a string (an absolute directory path)", KeyStateDir)
		}
		if dir == "" || !filepath.IsAbs(dir) {
			return fmt.Errorf("key %q must be an absolute directory path, got %q", KeyStateDir, dir)
		}
	}
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return fmt.Errorf("no %s key, no $%s and no home directory to put sandboxes in: %v", KeyStateDir, EnvStateDir, err)
		}
		dir = filepath.Join(home, ".iii", "sandbox", "hostdir")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the state directory %s: %v", dir, err)
	}
	p.mu.Lock()
	p.stateDir = dir
	p.mu.Unlock()
	p.log.Warn("sandbox-hostdir provides NO isolation: sandboxes are host directories and execs are host processes; use it for development and tests only",
		"state_dir", dir)
	return nil
}

// Info implements sandboxkit.Provider.
func (p *Provider) Info(context.Context) map[string]any {
	p.mu.Lock()
	dir := p.stateDir
	p.mu.Unlock()
	programs := map[string]any{}
	for _, img := range p.Presets() {
		if bin, err := lookPath(strings.TrimPrefix(img.OCIRef, hostRefPrefix), p.path, "/"); err == nil {
			programs[img.Name] = bin
		} else {
			programs[img.Name] = "missing"
		}
	}
	return map[string]any{
		"isolation":     "none",
		"warning":       "NO isolation: sandboxes are host directories and execs are host processes running as the adapter's user; for development and tests only",
		"state_dir":     dir,
		"host_programs": programs,
		"os":            runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// Boot implements sandboxkit.Provider: check the image's host program is
// there, make the sandbox directory and open it as the sandbox's root.
func (p *Provider) Boot(_ context.Context, spec sandboxkit.BootSpec) (sandboxkit.Sandbox, error) {
	p.mu.Lock()
	stateDir, hostPath := p.stateDir, p.path
	p.mu.Unlock()
	if stateDir == "" {
		return nil, contract.NewError(contract.S300, "sandbox-hostdir is not configured")
	}
	program, ok := strings.CutPrefix(spec.Image.OCIRef, hostRefPrefix)
	if !ok || program == "" {
		return nil, contract.NewError(contract.S101,
			"image %s has the reference %q, but sandbox-hostdir runs host programs only: give custom images the reference host:<program>",
			spec.Image.Name, spec.Image.OCIRef)
	}
	if _, err := lookPath(program, hostPath, "/"); err != nil {
		return nil, contract.NewError(contract.S101,
			"image %s runs the host's %s, which is not installed on this host (not found on PATH %s); install it or use another image",
			spec.Image.Name, program, hostPath)
	}
	dir := filepath.Join(stateDir, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, contract.NewError(contract.S300, "create the sandbox directory: %v", err)
	}
	sb, err := newSandbox(spec, dir, hostPath, p.log.With("sandbox_id", spec.ID))
	if err != nil {
		_ = removeTree(dir)
		return nil, contract.NewError(contract.S300, "prepare the sandbox directory: %v", err)
	}
	return sb, nil
}

// removeTree removes dir and everything in it, first making directories
// writable again: a sandbox may have chmod'ed its own files to 0.
func removeTree(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// lookPath finds program like a shell would on pathEnv: a name with a
// slash is taken as is (relative to dir), otherwise the first executable
// regular file of that name in a PATH directory.
func lookPath(program, pathEnv, dir string) (string, error) {
	if strings.Contains(program, "/") {
		p := program
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if _, err := os.Stat(p); err != nil {
			return "", err
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" || !filepath.IsAbs(d) {
			// Relative PATH entries would depend on the working
			// directory, which is inside the sandbox.
			continue
		}
		p := filepath.Join(d, program)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", program, errNotFound)
}

var errNotFound = errors.New("not found on PATH")

// stopWait bounds how long Stop waits for the execs it killed to return.
const stopWait = 30 * time.Second
