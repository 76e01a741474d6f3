package guest

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestPreferTSC(t *testing.T) {
	tests := []struct {
		name, current string
		want          bool
	}{
		{"refined jiffies", "refined-jiffies\n", true},
		{"plain jiffies", "jiffies\n", true},
		{"kvm-clock stays", "kvm-clock\n", false},
		{"tsc already", "tsc\n", false},
		{"tsc-early stays", "tsc-early\n", false},
		{"arm64's counter stays", "arch_sys_counter\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cur := filepath.Join(dir, "current_clocksource")
			assert.NilError(t, os.WriteFile(cur, []byte(tc.current), 0o644))
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
