package guest

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestPreferTSC(t *testing.T) {
	tests := []struct {
		name, current, available string
		want                     bool
	}{
		{"jiffies with a tsc", "refined-jiffies\n", "refined-jiffies jiffies tsc \n", true},
		{"plain jiffies", "jiffies\n", "jiffies tsc\n", true},
		{"no tsc to take", "refined-jiffies\n", "refined-jiffies jiffies \n", false},
		{"tsc-early is not tsc", "refined-jiffies\n", "refined-jiffies tsc-early\n", false},
		{"kvm-clock stays", "kvm-clock\n", "kvm-clock tsc hpet\n", false},
		{"tsc already", "tsc\n", "tsc refined-jiffies\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cur := filepath.Join(dir, "current_clocksource")
			assert.NilError(t, os.WriteFile(cur, []byte(tc.current), 0o644))
			assert.NilError(t, os.WriteFile(filepath.Join(dir, "available_clocksource"), []byte(tc.available), 0o644))
			got, err := PreferTSC(dir)
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
			b, err := os.ReadFile(cur)
			assert.NilError(t, err)
			if tc.want {
				assert.Equal(t, string(b), "tsc")
			} else {
				assert.Equal(t, string(b), tc.current, "left alone")
			}
		})
	}
	_, err := PreferTSC(filepath.Join(t.TempDir(), "none"))
	assert.ErrorContains(t, err, "read the clocksource")
}
