package exepages

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
)

func resident(t *testing.T) int64 {
	t.Helper()
	regions, err := Mappings()
	assert.NilError(t, err)
	assert.Assert(t, len(regions) > 0, "the test binary's own mappings are listed")
	var n int64
	for _, r := range regions {
		n += r.Resident
	}
	return n
}

// TestReleaseDropsStartupPages releases this test binary's code and
// read-only data and checks that the resident size falls and that the
// process still runs code it had used (and code it had not) afterwards.
func TestReleaseDropsStartupPages(t *testing.T) {
	// Touch code and read-only data before releasing.
	_, _ = json.Marshal(map[string]any{"a": []int{1, 2}})
	before := resident(t)
	released, err := Release()
	assert.NilError(t, err)
	assert.Assert(t, released > 0)
	after := resident(t)
	assert.Assert(t, after < before, "resident %d before Release, %d after", before, after)
	// Release covered most of what was resident. What the process maps
	// back right after (reading smaps, the test framework, on a loaded
	// machine up to half of it) is not Release's doing, so "after" is
	// only checked to have fallen.
	assert.Assert(t, released >= before/2, "resident %d before, %d released", before, released)

	out, err := json.Marshal(map[string]any{"a": []int{1, 2}})
	assert.NilError(t, err)
	assert.Equal(t, string(out), `{"a":[1,2]}`)
	// Code the test had not run before the release.
	sum := sha256.Sum256(out)
	assert.Equal(t, hex.EncodeToString(sum[:]), "01530d164d479cf08e26d3b1ad9bdba927120d97e2d057a6d792db778780d720")
}
