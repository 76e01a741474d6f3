package procstats

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestParseVmRSS(t *testing.T) {
	cases := []struct {
		name   string
		status string
		want   int64
		ok     bool
	}{
		{"usual", "Name:\tiii\nVmPeak:\t  900 kB\nVmRSS:\t   21904 kB\nRssAnon:\t 9000 kB\n", 21904 << 10, true},
		{"last line without newline", "Name:\tx\nVmRSS:\t1 kB", 1024, true},
		{"zero", "VmRSS:\t0 kB\n", 0, true},
		{"absent (a kernel thread)", "Name:\tkthreadd\nState:\tS\n", 0, false},
		{"other unit", "VmRSS:\t12 MB\n", 0, false},
		{"not a number", "VmRSS:\tlots kB\n", 0, false},
		{"negative", "VmRSS:\t-4 kB\n", 0, false},
		{"a longer key with the same start is not it", "VmRSSX:\t5 kB\n", 0, false},
		{"empty", "", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseVmRSS([]byte(tc.status))
			assert.Equal(t, ok, tc.ok)
			assert.Equal(t, got, tc.want)
		})
	}
}

func TestCountFDsMissingDir(t *testing.T) {
	_, err := countFDs("/proc/self/no-such-dir")
	assert.Assert(t, err != nil)
}

func TestMemAvailable(t *testing.T) {
	n, ok := MemAvailable()
	assert.Assert(t, ok)
	assert.Assert(t, n > 0)
	got, ok := parseKB([]byte("MemTotal: 10 kB\nMemAvailable:    2048 kB\n"), "MemAvailable:")
	assert.Assert(t, ok)
	assert.Equal(t, got, int64(2048<<10))
}
