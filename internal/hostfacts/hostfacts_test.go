package hostfacts

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestProbeKVM(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "kvm")
	assert.NilError(t, os.WriteFile(dev, nil, 0o600))
	guest := filepath.Join(dir, "cpuinfo-guest")
	assert.NilError(t, os.WriteFile(guest, []byte("processor\t: 0\nflags\t\t: fpu vme hypervisor lahf_lm\n"), 0o600))
	metal := filepath.Join(dir, "cpuinfo-metal")
	assert.NilError(t, os.WriteFile(metal, []byte("processor\t: 0\nflags\t\t: fpu vme vmx lahf_lm\n"), 0o600))

	tests := []struct {
		name, dev, cpuinfo, goos string
		want                     KVMState
		detail                   string
	}{
		{"missing", filepath.Join(dir, "none"), metal, "linux", KVMMissing, "does not exist"},
		// A directory stands in for a node this user may not open: root
		// opens any device, but nobody opens a directory read-write.
		{"cannot open", dir, metal, "linux", KVMNoAccess, "is a directory"},
		{"nested", dev, guest, "linux", KVMNested, "itself a VM"},
		{"bare metal", dev, metal, "linux", KVMPresent, "no hypervisor above it"},
		{"no cpuinfo", dev, filepath.Join(dir, "gone"), "linux", KVMPresent, "opens read-write"},
		{"macos", dev, metal, "darwin", KVMNotLinux, "darwin"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := probeKVM(tc.dev, tc.cpuinfo, tc.goos)
			assert.Equal(t, k.State, tc.want)
			assert.Check(t, is.Contains(k.String(), tc.detail))
		})
	}
}

func TestToolVersion(t *testing.T) {
	assert.Equal(t, ToolVersion("iii-no-such-tool-here").Version, "not installed")
	v := ToolVersion("go", "version")
	assert.Check(t, is.Contains(v.Version, "go version go"))
}
