package runner

import (
	"encoding/binary"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
)

func TestParsePID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		err  bool
	}{
		{"1234\n", 1234, false},
		{"1234", 1234, false},
		{"", 0, true},
		{"\n", 0, true},
		{"1", 0, true}, // init is never ours
		{"0", 0, true},
		{"-5", 0, true},
		{"12 34", 0, true},
		{"99999999999", 0, true},
		{"2147483648", 0, true},
		{"1234\n\n", 0, true},
	} {
		got, err := ParsePID([]byte(tc.in))
		if tc.err {
			assert.Check(t, err != nil, "%q", tc.in)
			continue
		}
		assert.NilError(t, err, "%q", tc.in)
		assert.Equal(t, got, tc.want)
	}
}

func FuzzParsePID(f *testing.F) {
	for _, s := range []string{"1234\n", "", "0", "-1", "99999999999"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := ParsePID(b); err == nil && n <= 1 {
			t.Fatalf("accepted pid %d", n)
		}
	})
}

func TestParseCmdline(t *testing.T) {
	assert.DeepEqual(t, ParseCmdline([]byte("a\x00b c\x00\x00d\x00")), []string{"a", "b c", "", "d"})
	assert.DeepEqual(t, ParseCmdline(nil), []string(nil))
	assert.DeepEqual(t, ParseCmdline([]byte("\x00")), []string(nil))
}

func procargs2(argc int32, exe string, pad int, args ...string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(argc))
	b = append(b, exe...)
	b = append(b, make([]byte, pad+1)...)
	for _, a := range args {
		b = append(append(b, a...), 0)
	}
	return append(b, "PATH=/bin\x00"...)
}

func TestParseProcArgs2(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want []string
	}{
		{"runner", procargs2(3, "/usr/local/bin/sandbox-libkrun", 7, "sandbox-libkrun", Subcommand, "/s/x"), []string{"sandbox-libkrun", Subcommand, "/s/x"}},
		{"no padding", procargs2(1, "/bin/x", 0, "x"), []string{"x"}},
		{"short", []byte{1, 0}, nil},
		{"argc 0", procargs2(0, "/bin/x", 0), nil},
		{"negative argc", procargs2(-1, "/bin/x", 0, "x"), nil},
		// Only two NUL-terminated strings follow (x and the environment).
		{"argc past the end", procargs2(5, "/bin/x", 0, "x"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ParseProcArgs2(tc.in)
			if len(tc.want) == 0 {
				assert.Check(t, len(got) == 0, "%q", got)
				return
			}
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

func FuzzParseProcArgs2(f *testing.F) {
	f.Add(procargs2(3, "/usr/local/bin/sandbox-libkrun", 7, "a", "b", "c"))
	f.Add([]byte{})
	f.Add([]byte{255, 255, 255, 127})
	f.Fuzz(func(t *testing.T, b []byte) {
		args := ParseProcArgs2(b)
		if len(args) > len(b) {
			t.Fatalf("%d arguments from %d bytes", len(args), len(b))
		}
	})
}

func TestBelongsTo(t *testing.T) {
	const dir = "/s/aaaaaaaa-0000-4000-8000-000000000001"
	for _, tc := range []struct {
		name string
		args []string
		want bool
	}{
		{"runner", []string{"/bin/sandbox-libkrun", Subcommand, dir}, true},
		{"runner of another dir", []string{"/bin/sandbox-libkrun", Subcommand, dir + "2"}, false},
		{"runner with the dir elsewhere", []string{"/bin/sandbox-libkrun", "x", dir}, false},
		{"qemu", []string{"/usr/bin/qemu-system-x86_64", "-M", "microvm", "-chardev", "socket,id=agent,path=" + dir + "/exec.sock"}, true},
		{"qemu aarch64", []string{"qemu-system-aarch64", "-serial", "file:" + dir + "/console.log"}, true},
		{"qemu of a sibling dir", []string{"qemu-system-x86_64", "-serial", "file:" + dir + "0/console.log"}, false},
		{"not qemu", []string{"/usr/bin/tail", "-f", dir + "/console.log"}, false},
		{"empty", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, BelongsTo(tc.args, dir), tc.want)
		})
	}
}

func TestDecodeConfig(t *testing.T) {
	good, err := (&Config{Version: ConfigVersion, Backend: backend.QEMU, Spec: backend.Spec{
		ID: "x", CPUs: 1, MemoryMiB: 128, Kernel: "/k", Initrd: "/i", StateDir: "/s/x", Accel: "tcg",
	}}).Encode()
	assert.NilError(t, err)
	c, err := DecodeConfig(good)
	assert.NilError(t, err)
	assert.Equal(t, c.Spec.MemoryMiB, 128)
	for name, in := range map[string]string{
		"empty":          "",
		"trailing":       string(good) + "{}",
		"unknown field":  `{"version":1,"backend":"qemu","spec":{},"extra":1}`,
		"old version":    `{"version":0,"backend":"qemu","spec":{}}`,
		"bad backend":    `{"version":1,"backend":"firecracker","spec":{}}`,
		"bad spec":       `{"version":1,"backend":"qemu","spec":{"id":"x"}}`,
		"relative paths": `{"version":1,"backend":"qemu","spec":{"id":"x","cpus":1,"memory_mib":128,"kernel":"k","initrd":"/i","state_dir":"/s","accel":"tcg"}}`,
		"long socket":    `{"version":1,"backend":"qemu","spec":{"id":"x","cpus":1,"memory_mib":128,"kernel":"/k","initrd":"/i","state_dir":"/` + strings.Repeat("a", 95) + `","accel":"tcg"}}`,
		// The network's policy is checked where the configuration is.
		"forward without network": netSpec(`"net_forwards":[{"guest_port":1,"host_addr":"127.0.0.1:2"}]`),
		"forward off loopback":    netSpec(`"network":true,"net_forwards":[{"guest_port":1,"host_addr":"192.0.2.1:2"}]`),
		"forward bad address":     netSpec(`"network":true,"net_forwards":[{"guest_port":1,"host_addr":"localhost:2"}]`),
		"allow loopback":          netSpec(`"network":true,"net_allow_cidrs":["127.0.0.0/8"]`),
		"allow everything":        netSpec(`"network":true,"net_allow_cidrs":["0.0.0.0/0"]`),
		"allow garbage":           netSpec(`"network":true,"net_allow_cidrs":["ten"]`),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeConfig([]byte(in))
			assert.Check(t, err != nil)
		})
	}
}

func netSpec(extra string) string {
	return `{"version":1,"backend":"qemu","spec":{"id":"x","cpus":1,"memory_mib":128,"kernel":"/k","initrd":"/i","state_dir":"/s","accel":"tcg",` + extra + `}}`
}

func TestDecodeConfigNetwork(t *testing.T) {
	c, err := DecodeConfig([]byte(netSpec(`"network":true,"net_allow_cidrs":["10.1.0.0/16"],"net_forwards":[{"guest_port":49134,"host_addr":"127.0.0.1:49134","bearer_token":"t"}]`)))
	assert.NilError(t, err)
	nc, err := c.Spec.NetConfig()
	assert.NilError(t, err)
	assert.Equal(t, len(nc.AllowCIDRs), 1)
	assert.Equal(t, nc.Forwards[0].HostAddr.String(), "127.0.0.1:49134")
	assert.Equal(t, nc.Forwards[0].BearerToken, "t")
}

func FuzzDecodeConfig(f *testing.F) {
	f.Add([]byte(`{"version":1,"backend":"qemu","spec":{"id":"x","cpus":1,"memory_mib":128,"kernel":"/k","initrd":"/i","state_dir":"/s","accel":"tcg"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeConfig(b)
		if err != nil {
			return
		}
		// Whatever decodes must validate and survive a round trip.
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		again, err := c.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeConfig(again); err != nil {
			t.Fatal(err)
		}
	})
}
