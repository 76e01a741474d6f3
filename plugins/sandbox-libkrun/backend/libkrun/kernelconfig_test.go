//go:build linux || darwin

package libkrun

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const debianLikeConfig = `#
# Automatically generated file; DO NOT EDIT.
CONFIG_VIRTIO=m
CONFIG_VIRTIO_MMIO=m
# CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES is not set
CONFIG_VIRTIO_CONSOLE=m
CONFIG_VIRTIO_BLK=m
CONFIG_VIRTIO_NET=m
CONFIG_LOCALVERSION=""
CONFIG_NOTHING=n
`

func TestParseKernelConfig(t *testing.T) {
	c, err := ParseKernelConfig(strings.NewReader(debianLikeConfig + "garbage line\nCONFIG_=y\n=y\n"))
	assert.NilError(t, err)
	assert.DeepEqual(t, map[string]string(c), map[string]string{
		"VIRTIO": "m", "VIRTIO_MMIO": "m", "VIRTIO_CONSOLE": "m", "VIRTIO_BLK": "m", "VIRTIO_NET": "m", "LOCALVERSION": `""`,
	})
}

func TestCheckForLibkrun(t *testing.T) {
	debian, err := ParseKernelConfig(strings.NewReader(debianLikeConfig))
	assert.NilError(t, err)
	withCmdline, err := ParseKernelConfig(strings.NewReader(debianLikeConfig + "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y\n"))
	assert.NilError(t, err)
	bare, err := ParseKernelConfig(strings.NewReader("CONFIG_VIRTIO_MMIO=y\nCONFIG_VIRTIO_CONSOLE=y\n"))
	assert.NilError(t, err)

	err = debian.CheckForLibkrun("amd64", true, true)
	var e *Error
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeBadSpec)
	assert.Check(t, is.ErrorContains(err, "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y"))
	assert.NilError(t, debian.CheckForLibkrun("arm64", true, true))
	assert.NilError(t, withCmdline.CheckForLibkrun("amd64", true, true))
	assert.NilError(t, bare.CheckForLibkrun("arm64", false, false))
	err = bare.CheckForLibkrun("arm64", true, true)
	assert.Check(t, is.ErrorContains(err, "CONFIG_VIRTIO_BLK (the root image), CONFIG_VIRTIO_NET (the NIC)"))
}

// TestHostKernelConfig checks the installed kernels' configs and that the
// verdict follows their VIRTIO_MMIO_CMDLINE_DEVICES line.
func TestHostKernelConfig(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the command-line device rule is x86_64's")
	}
	configs, _ := filepath.Glob("/boot/config-*")
	if len(configs) == 0 {
		t.Skip("no kernel config in /boot")
	}
	for _, p := range configs {
		f, err := os.Open(p)
		assert.NilError(t, err)
		hasCmdline := false
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			hasCmdline = hasCmdline || sc.Text() == "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y"
		}
		f.Close()
		err = CheckKernelConfigFile(p, "amd64", false, false)
		t.Logf("%s: %v", p, err)
		if hasCmdline {
			assert.Check(t, !strings.Contains(errString(err), "CMDLINE_DEVICES"), p)
		} else {
			assert.Check(t, is.ErrorContains(err, "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y"), p)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func FuzzParseKernelConfig(f *testing.F) {
	f.Add(debianLikeConfig)
	f.Add("CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=\"x=y\"\n")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseKernelConfig(strings.NewReader(s))
		if err != nil {
			return
		}
		for k, v := range c {
			if k == "" || v == "n" {
				t.Fatalf("parsed %q=%q", k, v)
			}
		}
		_ = c.CheckForLibkrun("amd64", true, true)
	})
}
