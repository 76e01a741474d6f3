package boot

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
)

func elfHeader(class, data byte, typ, machine uint16) []byte {
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4], h[5] = class, data
	binary.LittleEndian.PutUint16(h[16:], typ)
	binary.LittleEndian.PutUint16(h[18:], machine)
	return h
}

func TestELFArch(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want string
		err  string
	}{
		{"amd64", elfHeader(2, 1, 2, 62), "amd64", ""},
		{"arm64 PIE", elfHeader(2, 1, 3, 183), "arm64", ""},
		{"32-bit", elfHeader(1, 1, 2, 3), "", "64-bit"},
		{"big endian", elfHeader(2, 2, 2, 62), "", "64-bit little-endian"},
		{"object file", elfHeader(2, 1, 1, 62), "", "not an executable"},
		{"riscv", elfHeader(2, 1, 2, 243), "", "neither"},
		{"script", []byte("#!/bin/sh\necho hello world\n"), "", "not an ELF"},
		{"short", []byte("\x7fELF"), "", "not an ELF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ELFArch(tc.in)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}

func FuzzELFArch(f *testing.F) {
	f.Add(elfHeader(2, 1, 2, 62))
	f.Add([]byte("#!"))
	f.Fuzz(func(t *testing.T, b []byte) {
		arch, err := ELFArch(b)
		if err == nil && arch != "amd64" && arch != "arm64" {
			t.Fatalf("arch %q", arch)
		}
	})
}

func TestFindAgent(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.WriteFile(p, b, 0o755))
		return p
	}
	exe := filepath.Join(dir, "bin", "sandbox-libkrun")
	beside := filepath.Join(dir, "bin", AgentName("amd64"))
	home := filepath.Join(dir, "home")
	inHome := filepath.Join(home, ".iii", "lib", AgentName("amd64"))
	assert.DeepEqual(t, agentCandidates(&config.Config{}, exe, home, "amd64"), []string{beside, inHome})
	assert.DeepEqual(t, agentCandidates(&config.Config{AgentPath: "/x"}, exe, home, "amd64"), []string{"/x"})

	_, err := findAgent([]string{beside, inHome}, "amd64")
	assert.Assert(t, contract.IsCode(err, contract.S300), "%v", err)
	assert.ErrorContains(t, err, beside+": not there")
	assert.ErrorContains(t, err, "go build -o bin/iii-guest-agent-linux-amd64")

	arm := write("arm", elfHeader(2, 1, 2, 183))
	script := write("script", []byte("#!/bin/sh\nexit 0\n................"))
	good := write("good", elfHeader(2, 1, 2, 62))
	_, err = findAgent([]string{arm, script}, "amd64")
	assert.ErrorContains(t, err, "built for linux/arm64")
	assert.ErrorContains(t, err, "not an ELF")
	got, err := findAgent([]string{arm, good}, "amd64")
	assert.NilError(t, err)
	assert.Equal(t, got, good)
}

func TestFindKernelConfigured(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "vmlinuz-9.9.9-test")
	assert.NilError(t, os.WriteFile(k, []byte("kernel"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "config-9.9.9-test"), []byte("CONFIG_X=y\n"), 0o644))
	got, err := findKernel(&config.Config{Kernel: k}, "amd64")
	assert.NilError(t, err)
	assert.Equal(t, got.Path, k)
	assert.Equal(t, got.Version, "9.9.9-test")
	assert.Equal(t, got.Config, filepath.Join(dir, "config-9.9.9-test"))
	assert.Equal(t, got.ModulesDir, "") // no /lib/modules/9.9.9-test here

	_, err = findKernel(&config.Config{Kernel: filepath.Join(dir, "missing")}, "amd64")
	assert.ErrorContains(t, err, "S300")
}

func TestTailFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	assert.Equal(t, tailFile(p, 3), "")
	assert.NilError(t, os.WriteFile(p, []byte("a\nb\nc\nd\n\n"), 0o644))
	assert.Equal(t, tailFile(p, 2), "c\nd")
	assert.Equal(t, tailFile(p, 10), "a\nb\nc\nd")
}
