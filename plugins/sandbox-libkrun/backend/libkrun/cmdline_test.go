//go:build linux || darwin

package libkrun

import (
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

func TestBuildCmdline(t *testing.T) {
	tests := []struct {
		name string
		opts CmdlineOptions
		want string
		err  string
	}{
		{"amd64 initramfs root", CmdlineOptions{Arch: "amd64"},
			"console=ttyS0 reboot=k panic=-1 no-kvmapf quiet", ""},
		{"arm64 disk", CmdlineOptions{Arch: "arm64", RootDisk: true, RootFSType: "ext4", UpperSize: "50%"},
			"console=ttyAMA0 reboot=k panic=-1 quiet iii.root=/dev/vda iii.rootfstype=ext4 iii.upper_size=50%", ""},
		{"debug host extra", CmdlineOptions{Arch: "amd64", RootDisk: true, Hostname: "sb-1", Debug: true, Extra: []string{"loglevel=7"}},
			"console=ttyS0 reboot=k panic=-1 no-kvmapf iii.debug=1 iii.root=/dev/vda iii.rootfstype=erofs iii.hostname=sb-1 loglevel=7", ""},
		{"extra with space", CmdlineOptions{Arch: "amd64", Extra: []string{"a b"}}, "", "spaces or quotes"},
		{"empty extra", CmdlineOptions{Arch: "amd64", Extra: []string{""}}, "", "empty"},
		{"bad fstype", CmdlineOptions{Arch: "amd64", RootDisk: true, RootFSType: "nfs"}, "", "kernel command line"},
		{"bad hostname", CmdlineOptions{Arch: "amd64", Hostname: "-x"}, "", "kernel command line"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := BuildCmdline(tc.opts)
			if tc.err != "" {
				var e *Error
				assert.Assert(t, errors.As(err, &e))
				assert.Equal(t, e.Code, CodeBadSpec)
				assert.Check(t, is.ErrorContains(err, tc.err))
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
			// The agent reads back what the options asked for.
			p, err := agentproto.ParseBootParams(got)
			assert.NilError(t, err)
			if tc.opts.RootDisk {
				assert.Equal(t, p.Root, "/dev/vda")
			}
			assert.Equal(t, p.Port, agentproto.PortName)
		})
	}
}

func TestCheckEnv(t *testing.T) {
	tests := []struct {
		env []string
		err string
	}{
		{nil, ""},
		{[]string{"PATH=/bin", "_X=", "A1=two words", "U=héllo"}, ""},
		{[]string{"=v"}, "not KEY=VALUE"},
		{[]string{"novalue"}, "not KEY=VALUE"},
		{[]string{"1A=x"}, "letters, digits"},
		{[]string{"A-B=x"}, "letters, digits"},
		{[]string{"mod.param=x"}, "letters, digits"},
		{[]string{`A=say "hi"`}, "quote"},
		{[]string{"A=line\nbreak"}, "control"},
		{[]string{"A=\x7f"}, "control"},
		{[]string{"A=\xff"}, "not UTF-8"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.env, ","), func(t *testing.T) {
			err := checkEnv(tc.env)
			if tc.err == "" {
				assert.NilError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

func TestCmdlineLimits(t *testing.T) {
	assert.Equal(t, CmdlineMax("arm64"), 2048)
	assert.Equal(t, CmdlineMax("amd64"), 65536)
	assert.Equal(t, cmdlineSize("ab", []string{"K=V"}), 2+3+3)
	assert.Equal(t, KernelConsole("amd64"), "ttyS0")
	assert.Equal(t, KernelConsole("arm64"), "ttyAMA0")
}

// FuzzCheckEnv: whatever checkEnv accepts can sit on a kernel command line
// as a quoted word the kernel hands to init unchanged.
func FuzzCheckEnv(f *testing.F) {
	for _, s := range []string{"A=1", "PATH=/usr/bin:/bin", `A="`, "A=\n", "a.b=c", "=", "_=x y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, kv string) {
		if checkEnv([]string{kv}) != nil {
			return
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, ". \"") || strings.ContainsAny(v, "\"\n\r\t\x00") {
			t.Fatalf("accepted %q", kv)
		}
	})
}

// FuzzBuildCmdline: BuildCmdline never panics, and a line it returns is
// one the agent accepts.
func FuzzBuildCmdline(f *testing.F) {
	f.Add("amd64", true, "erofs", "512m", "sb-1", false, "loglevel=7")
	f.Add("arm64", false, "", "", "", true, "")
	f.Fuzz(func(t *testing.T, arch string, disk bool, fstype, upper, host string, debug bool, extra string) {
		var ex []string
		if extra != "" {
			ex = strings.Split(extra, ",")
		}
		line, err := BuildCmdline(CmdlineOptions{Arch: arch, RootDisk: disk, RootFSType: fstype, UpperSize: upper,
			Hostname: host, Debug: debug, Extra: ex})
		if err != nil {
			return
		}
		if _, err := agentproto.ParseBootParams(line); err != nil {
			t.Fatalf("returned %q, which the agent refuses: %v", line, err)
		}
	})
}
