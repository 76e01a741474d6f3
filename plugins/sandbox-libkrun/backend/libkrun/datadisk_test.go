package libkrun

import (
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// TestBuildCmdlineDataDisk: with a worker's data disk, both disks are named
// by the block ids libkrun gives the guest as serials.
func TestBuildCmdlineDataDisk(t *testing.T) {
	got, err := BuildCmdline(CmdlineOptions{Arch: "arm64", RootDisk: true, DataDisk: true, UpperSize: "1g"})
	assert.NilError(t, err)
	assert.Equal(t, got, "console=ttyAMA0 reboot=k panic=-1 quiet iii.root=serial:vda iii.upper=serial:iii-upper iii.rootfstype=erofs")
	p, err := agentproto.ParseBootParams(got)
	assert.NilError(t, err)
	assert.Equal(t, p.Root, agentproto.SerialPrefix+rootBlockID)
	assert.Equal(t, p.Upper, agentproto.SerialPrefix+dataBlockID)
}
