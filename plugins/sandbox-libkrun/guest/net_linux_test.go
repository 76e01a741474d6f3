package guest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

func TestNetlinkMessages(t *testing.T) {
	prefix := netip.MustParsePrefix("10.0.2.15/24")
	gw := netip.MustParseAddr("10.0.2.2")
	tests := []struct {
		name  string
		msg   []byte
		typ   uint16
		attrs map[uint16][]byte
	}{
		{"link up", linkUpMessage(1, 2), rtmNewLink, nil},
		{"address", addrMessage(2, 2, prefix), rtmNewAddr, map[uint16][]byte{ifaLocal: {10, 0, 2, 15}, ifaAddress: {10, 0, 2, 15}}},
		{"route", routeMessage(3, 2, gw), rtmNewRoute, map[uint16][]byte{rtaGateway: {10, 0, 2, 2}, rtaOIF: binary.NativeEndian.AppendUint32(nil, 2)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msgs, err := syscall.ParseNetlinkMessage(tc.msg)
			assert.NilError(t, err)
			assert.Equal(t, len(msgs), 1)
			m := msgs[0]
			assert.Equal(t, m.Header.Type, tc.typ)
			assert.Equal(t, int(m.Header.Len), len(tc.msg))
			assert.Assert(t, m.Header.Flags&syscall.NLM_F_ACK != 0)
			if tc.attrs == nil {
				assert.Equal(t, binary.NativeEndian.Uint32(m.Data[4:8]), uint32(2)) // ifindex
				assert.Equal(t, binary.NativeEndian.Uint32(m.Data[8:12]), uint32(syscall.IFF_UP))
				return
			}
			attrs, err := syscall.ParseNetlinkRouteAttr(&m)
			assert.NilError(t, err)
			got := map[uint16][]byte{}
			for _, a := range attrs {
				got[a.Attr.Type] = a.Value
			}
			assert.DeepEqual(t, got, tc.attrs)
		})
	}
	assert.Equal(t, addrMessage(1, 1, prefix)[nlmsgHdrLen+1], byte(24))
}

func ackMsg(seq uint32, code int32) []byte {
	body := binary.NativeEndian.AppendUint32(nil, uint32(code))
	body = append(body, make([]byte, nlmsgHdrLen)...)
	b := binary.NativeEndian.AppendUint32(nil, uint32(nlmsgHdrLen+len(body)))
	b = binary.NativeEndian.AppendUint16(b, nlmsgError)
	b = binary.NativeEndian.AppendUint16(b, 0)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return append(b, body...)
}

func TestParseAck(t *testing.T) {
	assert.NilError(t, parseAck(ackMsg(7, 0), 7))
	assert.ErrorIs(t, parseAck(ackMsg(7, -int32(syscall.EEXIST)), 7), syscall.EEXIST)
	assert.ErrorIs(t, parseAck(ackMsg(6, 0), 7), errNoAck)
	assert.ErrorIs(t, parseAck(append(ackMsg(6, 0), ackMsg(7, -1)...), 7), syscall.EPERM)
	assert.ErrorContains(t, parseAck([]byte{1, 0, 0, 0, 2, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0}, 7), "out of range")
	assert.ErrorContains(t, parseAck(ackMsg(7, 0)[:nlmsgHdrLen+2], 7), "out of range")
}

func FuzzParseAck(f *testing.F) {
	f.Add(ackMsg(1, 0), uint32(1))
	f.Add(append(ackMsg(2, -17), 0, 0), uint32(1))
	f.Fuzz(func(t *testing.T, b []byte, seq uint32) {
		_ = parseAck(b, seq)
	})
}

type netReport struct {
	Addrs  []string `json:"addrs"`
	Route  string   `json:"route"`
	Resolv string   `json:"resolv"`
	Err    string   `json:"err,omitempty"`
}

// TestNetworkConfigure runs the real rtnetlink configuration in a child
// process placed in a new network namespace, against its loopback device.
func TestNetworkConfigure(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a network namespace needs root")
	}
	root := t.TempDir()
	assert.NilError(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	assert.NilError(t, os.Symlink("/run/systemd/resolve/stub-resolv.conf", filepath.Join(root, "etc/resolv.conf")))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GUEST_TEST_HELPER=netns", "GUEST_TEST_ROOT="+root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(err.Error(), "operation not permitted") {
		t.Skipf("cannot create a network namespace here: %v", err)
	}
	assert.NilError(t, err, string(out))
	var rep netReport
	assert.NilError(t, json.Unmarshal(out, &rep), string(out))
	assert.Equal(t, rep.Err, "")
	assert.Assert(t, strings.Contains(strings.Join(rep.Addrs, " "), "10.9.9.9/24"), "%v", rep.Addrs)
	assert.Equal(t, rep.Route, "10.9.9.1")
	assert.Equal(t, rep.Resolv, "nameserver 10.9.9.53\nnameserver 10.9.9.54\n")
}

func netnsHelper() {
	rep := netReport{}
	defer func() {
		b, _ := json.Marshal(rep)
		fmt.Println(string(b))
	}()
	n := &Network{Root: os.Getenv("GUEST_TEST_ROOT")}
	req := &agentproto.NetRequest{Interface: "lo", Address: "10.9.9.9/24", Gateway: "10.9.9.1", DNS: []string{"10.9.9.53", "10.9.9.54"}}
	// Twice: the second run finds everything in place and still succeeds.
	for range 2 {
		if _, err := n.Configure(context.Background(), req); err != nil {
			rep.Err = err.Error()
			return
		}
	}
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		rep.Err = err.Error()
		return
	}
	addrs, _ := lo.Addrs()
	for _, a := range addrs {
		rep.Addrs = append(rep.Addrs, a.String())
	}
	routes, _ := os.ReadFile("/proc/net/route")
	for _, line := range strings.Split(string(routes), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 2 && f[1] == "00000000" { // the default route
			var v uint32
			if _, err := fmt.Sscanf(f[2], "%X", &v); err == nil {
				// /proc/net/route prints the gateway in host byte order.
				rep.Route = netip.AddrFrom4([4]byte(binary.NativeEndian.AppendUint32(nil, v))).String()
			}
		}
	}
	resolv, _ := os.ReadFile(filepath.Join(n.Root, "etc/resolv.conf"))
	rep.Resolv = string(resolv)
}

func TestNetworkRejectsBadInput(t *testing.T) {
	n := &Network{Root: t.TempDir()}
	for _, req := range []agentproto.NetRequest{
		{Address: "10.0.2.15"}, {Address: "fe80::1/64"}, {Gateway: "nope"}, {DNS: []string{"x"}},
	} {
		_, err := n.Configure(context.Background(), &req)
		assert.Equal(t, codeOf(t, err), agentproto.CodeInvalidRequest, "%+v", req)
	}
}
