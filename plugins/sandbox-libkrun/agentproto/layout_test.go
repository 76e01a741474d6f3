package agentproto

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestParseBootParams(t *testing.T) {
	tests := []struct {
		in   string
		want BootParams
		err  string
	}{
		{"console=ttyS0 quiet panic=-1", BootParams{RootFSType: "erofs", Port: PortName}, ""},
		{"quiet iii.root=/dev/vda iii.rootfstype=ext4 iii.upper_size=50% iii.hostname=sb-1 iii.debug",
			BootParams{Root: "/dev/vda", RootFSType: "ext4", UpperSize: "50%", Port: PortName, Hostname: "sb-1", Debug: true}, ""},
		{`iii.port="my.port" iii.debug=0`, BootParams{RootFSType: "erofs", Port: "my.port"}, ""},
		{"iii.root=/etc/passwd", BootParams{}, "device path"},
		{"iii.root=/dev/../etc", BootParams{}, "device path"},
		{"iii.rootfstype=nfs", BootParams{}, "erofs"},
		{"iii.upper_size=lots", BootParams{}, "tmpfs size"},
		{"iii.hostname=-bad", BootParams{}, "host name"},
		{"iii.port=a/b", BootParams{}, "port name"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseBootParams(tc.in)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
	assert.DeepEqual(t, splitCmdline(` a="b c"  d `), []string{"a=b c", "d"})
}

func TestModuleManifest(t *testing.T) {
	paths := []string{ModulesDir + "/virtio_ring.ko", ModulesDir + "/kernel/fs/erofs/erofs.ko.xz"}
	got, err := ParseModuleManifest(FormatModuleManifest(paths))
	assert.NilError(t, err)
	assert.DeepEqual(t, got, paths)
	assert.Assert(t, ModuleCompressed(paths[1]) && !ModuleCompressed(paths[0]))

	for _, bad := range []string{"/etc/passwd.ko", ModulesDir + "/../x.ko", ModulesDir + "/x.txt", "relative.ko"} {
		_, err := ParseModuleManifest(bad + "\n")
		assert.Assert(t, err != nil, bad)
	}
}

func FuzzParseBootParams(f *testing.F) {
	f.Add("console=ttyS0 iii.root=/dev/vda iii.rootfstype=erofs")
	f.Add(`iii.hostname="x y" "`)
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseBootParams(s)
		if err == nil && p.Root != "" && p.Root[:5] != "/dev/" {
			t.Fatalf("root %q accepted", p.Root)
		}
	})
}

func FuzzParseModuleManifest(f *testing.F) {
	f.Add(FormatModuleManifest([]string{ModulesDir + "/a.ko"}))
	f.Fuzz(func(t *testing.T, s string) {
		paths, err := ParseModuleManifest(s)
		if err != nil {
			return
		}
		for _, p := range paths {
			if len(p) <= len(ModulesDir)+1 || p[:len(ModulesDir)+1] != ModulesDir+"/" {
				t.Fatalf("path %q accepted", p)
			}
		}
	})
}
