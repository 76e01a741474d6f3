package engine

import (
	"testing"

	"github.com/google/uuid"
	"gotest.tools/v3/assert"
)

// TestIDs: the ids are version-4 UUIDs written as uuid.NewString writes
// them, distinct, in one allocation each (a pair in one).
func TestIDs(t *testing.T) {
	a, b := newIDPair()
	for _, tc := range []struct {
		name string
		id   string
	}{
		{"one", newID()},
		{"a pair's first", a},
		{"a pair's second", b},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := uuid.Parse(tc.id)
			assert.NilError(t, err)
			assert.Equal(t, u.Version(), uuid.Version(4))
			assert.Equal(t, u.Variant(), uuid.RFC4122)
			assert.Equal(t, u.String(), tc.id, "the form uuid.NewString writes")
		})
	}
	seen := map[string]bool{}
	for range 1000 {
		x, y := newIDPair()
		for _, id := range []string{newID(), x, y} {
			assert.Assert(t, !seen[id], "%s twice", id)
			seen[id] = true
		}
	}
	if raceEnabled {
		return // the race detector allocates on its own account
	}
	assert.Equal(t, testing.AllocsPerRun(100, func() { _ = newID() }), 1.0)
	assert.Equal(t, testing.AllocsPerRun(100, func() { _, _ = newIDPair() }), 1.0)
}
