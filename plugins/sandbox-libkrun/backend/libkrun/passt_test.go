//go:build linux || darwin

package libkrun

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
)

// TestRealPasstAnswersARP starts the real passt the way Boot does and talks
// to it the way libkrun's unixstream NIC does (each frame prefixed with its
// 32-bit big-endian length): an ARP request for the gateway must get an ARP
// reply, and closing the VM's end must make passt exit.
func TestRealPasstAnswersARP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts passt")
	}
	bin, err := exec.LookPath("passt")
	if err != nil {
		t.Skip("passt is not installed")
	}
	vmFD, passtFD, err := socketpair()
	assert.NilError(t, err)
	p, err := startPasst(bin, passtFD, hclog.NewNullLogger())
	assert.NilError(t, err)
	defer p.kill()

	vm := os.NewFile(uintptr(vmFD), "vm-end")
	conn, err := net.FileConn(vm)
	assert.NilError(t, err)
	_ = vm.Close()
	assert.NilError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))

	mac := net.HardwareAddr{0x5a, 0x94, 0xef, 0x01, 0x02, 0x03}
	guest, gw := net.ParseIP("10.0.2.15").To4(), net.ParseIP(GuestGateway).To4()
	frame := arpRequest(mac, guest, gw)
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(frame)))
	_, err = conn.Write(append(hdr[:], frame...))
	assert.NilError(t, err)

	for {
		_, err := io.ReadFull(conn, hdr[:])
		assert.NilError(t, err, "passt sent no ARP reply")
		n := binary.BigEndian.Uint32(hdr[:])
		assert.Assert(t, n <= 65536)
		got := make([]byte, n)
		_, err = io.ReadFull(conn, got)
		assert.NilError(t, err)
		if len(got) < 42 || binary.BigEndian.Uint16(got[12:]) != 0x0806 || binary.BigEndian.Uint16(got[20:]) != 2 {
			continue // not an ARP reply
		}
		assert.DeepEqual(t, net.HardwareAddr(got[0:6]), mac)   // to us
		assert.Assert(t, bytes.Equal(got[28:32], gw))          // "10.0.2.2 is at"
		assert.DeepEqual(t, net.HardwareAddr(got[32:38]), mac) // target hardware address
		break
	}
	assert.NilError(t, p.exited())
	assert.NilError(t, conn.Close())
	// --one-off: the VM's end closing (the runner exiting) ends passt.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case <-p.done:
			return poll.Success()
		default:
			return poll.Continue("passt still running")
		}
	}, poll.WithTimeout(20*time.Second))
}

func arpRequest(mac net.HardwareAddr, sender, target net.IP) []byte {
	b := make([]byte, 42)
	copy(b[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(b[6:12], mac)
	binary.BigEndian.PutUint16(b[12:], 0x0806)
	binary.BigEndian.PutUint16(b[14:], 1)      // Ethernet
	binary.BigEndian.PutUint16(b[16:], 0x0800) // IPv4
	b[18], b[19] = 6, 4
	binary.BigEndian.PutUint16(b[20:], 1) // request
	copy(b[22:28], mac)
	copy(b[28:32], sender)
	copy(b[38:42], target)
	return b
}

func TestPasstArgs(t *testing.T) {
	assert.DeepEqual(t, PasstArgs(), []string{"--foreground", "--one-off", "--quiet", "--stderr", "--fd", "3",
		"--address", "10.0.2.15", "--netmask", "24", "--gateway", "10.0.2.2"})
}
