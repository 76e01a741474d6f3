package backend

import (
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/usernet"
)

// TestServeNetwork serves a NIC as the qemu and libkrun back ends do, speaks to
// it as the VM does (an ARP request for the gateway, length-prefixed), and
// checks the network ends once the VM's end closes.
func TestServeNetwork(t *testing.T) {
	runnerEnd, vmEnd, err := usernet.Pair()
	assert.NilError(t, err)
	spec := Spec{Network: true, NetForwards: []NetForward{{GuestPort: 49134, HostAddr: "127.0.0.1:49134"}}}
	wait, err := ServeNetwork(context.Background(), runnerEnd, spec, hclog.NewNullLogger())
	assert.NilError(t, err)
	vm, err := net.FileConn(vmEnd)
	assert.NilError(t, err)
	_ = vmEnd.Close()
	assert.NilError(t, vm.SetDeadline(time.Now().Add(20*time.Second)))

	mac := []byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	arp := make([]byte, 42)
	copy(arp[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(arp[6:12], mac)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	binary.BigEndian.PutUint16(arp[14:], 1)
	binary.BigEndian.PutUint16(arp[16:], 0x0800)
	arp[18], arp[19] = 6, 4
	binary.BigEndian.PutUint16(arp[20:], 1)
	copy(arp[22:28], mac)
	copy(arp[28:32], []byte{10, 0, 2, 15})
	copy(arp[38:42], []byte{10, 0, 2, 2})
	assert.NilError(t, usernet.WriteFrame(vm, arp))
	fr := usernet.NewFrameReader(vm)
	for {
		f, err := fr.Next()
		assert.NilError(t, err, "no ARP reply")
		if len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0806 && binary.BigEndian.Uint16(f[20:]) == 2 {
			assert.DeepEqual(t, f[28:32], []byte{10, 0, 2, 2})
			break
		}
	}
	assert.NilError(t, vm.Close())
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(netWait + 5*time.Second):
		t.Fatal("the network did not end with the VM's end")
	}
}

func TestServeNetworkRefusesBadSpec(t *testing.T) {
	runnerEnd, vmEnd, err := usernet.Pair()
	assert.NilError(t, err)
	defer vmEnd.Close()
	_, err = ServeNetwork(context.Background(), runnerEnd, Spec{Network: true, NetAllowCIDRs: []string{"169.254.0.0/16"}}, hclog.NewNullLogger())
	assert.ErrorContains(t, err, "link-local")
}
