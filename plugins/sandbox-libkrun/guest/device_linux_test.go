package guest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// TestResolveDeviceBySerial finds disks by their virtio serial in a
// sysfs-like tree, whatever letter they got.
func TestResolveDeviceBySerial(t *testing.T) {
	sys, dev := t.TempDir(), t.TempDir()
	for name, serial := range map[string]string{"vda": "iii-upper\n", "vdb": "iii-root\n"} {
		assert.NilError(t, os.MkdirAll(filepath.Join(sys, name), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(sys, name, "serial"), []byte(serial), 0o644))
		assert.NilError(t, os.WriteFile(filepath.Join(dev, name), nil, 0o644))
	}
	got, err := resolveDevice("serial:iii-root", sys, dev, time.Second)
	assert.NilError(t, err)
	assert.Equal(t, got, filepath.Join(dev, "vdb"))
	got, err = resolveDevice("serial:iii-upper", sys, dev, time.Second)
	assert.NilError(t, err)
	assert.Equal(t, got, filepath.Join(dev, "vda"))
	_, err = resolveDevice("serial:nope", sys, dev, 10*time.Millisecond)
	assert.ErrorContains(t, err, "did not appear")
	got, err = resolveDevice(filepath.Join(dev, "vda"), sys, dev, time.Second)
	assert.NilError(t, err)
	assert.Equal(t, got, filepath.Join(dev, "vda"))
}
