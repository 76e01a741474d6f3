package adapter

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/catalog"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

func newTestProvider(t *testing.T, opts Options) *Provider {
	t.Helper()
	if opts.Executable == "" {
		opts.Executable = "/nonexistent/sandbox-libkrun"
	}
	if opts.Home == "" {
		opts.Home = dirs.Short(t, "ah")
	}
	p, err := NewProvider(opts)
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NilError(t, p.Shutdown(ctx))
	})
	return p
}

func rawKeys(t *testing.T, m map[string]any) map[string]json.RawMessage {
	t.Helper()
	out := map[string]json.RawMessage{}
	for k, v := range m {
		b, err := json.Marshal(v)
		assert.NilError(t, err)
		out[k] = b
	}
	return out
}

// The presets come from package catalog, the one place they are listed.
func TestPresetsFromCatalog(t *testing.T) {
	p := newTestProvider(t, Options{})
	var want []contract.CatalogImage
	for _, e := range catalog.Presets() {
		want = append(want, contract.CatalogImage{Name: e.Name, OCIRef: e.OCIRef})
	}
	assert.DeepEqual(t, p.Presets(), want)
}

func TestInfoBeforeConfigure(t *testing.T) {
	p := newTestProvider(t, Options{})
	assert.DeepEqual(t, p.Info(context.Background()), map[string]any{"isolation": "microvm", "backend_state": "unconfigured"})
}

// TestConfigureErrors: what Configure refuses, and the key it names.
func TestConfigureErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys map[string]any
		key  string
	}{
		{"a remote plain-http mirror", map[string]any{"registry_mirrors": map[string]any{"docker.io": "http://mirror.invalid:5000"}}, config.KeyRegistryMirrors},
		{"a bad accel", map[string]any{"accel": "turbo"}, config.KeyAccel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home := dirs.Short(t, "ah")
			p := newTestProvider(t, Options{Home: home})
			err := p.Configure(context.Background(), rawKeys(t, tc.keys))
			var ce *config.ConfigError
			assert.Assert(t, is.ErrorType(err, ce), "%v", err)
			assert.Equal(t, err.(*config.ConfigError).Key, tc.key)
		})
	}
}

// TestSelectionFailureIsS300 configures a QEMU binary that does not exist:
// the boot fails with S300 naming it, adapter::info says why, and nothing
// is left in state_dir.
func TestSelectionFailureIsS300(t *testing.T) {
	home := dirs.Short(t, "ah")
	agent := filepath.Join(home, "agent")
	assert.NilError(t, os.WriteFile(agent, elfHeader(2, 1, 2, machineOf(t)), 0o755))
	kernel := filepath.Join(home, "vmlinuz-0.0.0-none")
	assert.NilError(t, os.WriteFile(kernel, []byte("not a kernel"), 0o644))
	p := newTestProvider(t, Options{Home: home})
	assert.NilError(t, p.Configure(context.Background(), rawKeys(t, map[string]any{
		"hypervisor": "qemu", "qemu_binary": filepath.Join(home, "no-qemu"), "agent_path": agent, "kernel": kernel,
	})))
	_, err := p.Boot(context.Background(), sandboxkit.BootSpec{ID: "aaaaaaaa-0000-4000-8000-000000000001", CPUs: 1, MemoryMB: 128,
		Image: contract.CatalogImage{Name: "python", OCIRef: "docker.io/iiidev/python:latest"}})
	assert.Assert(t, contract.IsCode(err, contract.S300), "%v", err)
	assert.ErrorContains(t, err, "no-qemu is not an executable file")
	info := p.Info(context.Background())
	assert.Equal(t, info["backend_state"], "failed")
	assert.Check(t, strings.Contains(info["backend_error"].(string), "no-qemu"))
	assert.Check(t, is.Len(dirs.Names(t, filepath.Join(home, ".iii", "sandbox")), 0))
}

// elfHeader is the start of an ELF file of that class, byte order, type
// and machine: enough for the adapter's check of its guest agent.
func elfHeader(class, data byte, typ, machine uint16) []byte {
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4], h[5] = class, data
	binary.LittleEndian.PutUint16(h[16:], typ)
	binary.LittleEndian.PutUint16(h[18:], machine)
	return h
}

// machineOf is the ELF machine number of this host's architecture.
func machineOf(t *testing.T) uint16 {
	t.Helper()
	m, ok := map[string]uint16{"amd64": 62, "arm64": 183}[runtime.GOARCH]
	if !ok {
		t.Skip("the guest agent exists for amd64 and arm64 only")
	}
	return m
}
