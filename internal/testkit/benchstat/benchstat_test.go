package benchstat

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

func TestMedianAndPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		in      []time.Duration
		p       int
		median  time.Duration
		percent time.Duration
	}{
		{name: "none", in: nil, p: 50, median: 0, percent: 0},
		{name: "one", in: ms(7), p: 99, median: 7 * time.Millisecond, percent: 7 * time.Millisecond},
		{name: "odd", in: ms(5, 1, 3), p: 50, median: 3 * time.Millisecond, percent: 3 * time.Millisecond},
		{name: "even takes the upper median", in: ms(4, 1, 3, 2), p: 50, median: 3 * time.Millisecond, percent: 2 * time.Millisecond},
		{name: "p99 of ten is the largest", in: ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), p: 99, median: 6 * time.Millisecond, percent: 10 * time.Millisecond},
		{name: "p0 is the smallest", in: ms(9, 4, 6), p: 0, median: 6 * time.Millisecond, percent: 4 * time.Millisecond},
		{name: "p100 is the largest", in: ms(9, 4, 6), p: 100, median: 6 * time.Millisecond, percent: 9 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := append([]time.Duration(nil), tc.in...)
			assert.Equal(t, Median(tc.in), tc.median)
			assert.Equal(t, Percentile(tc.in, tc.p), tc.percent)
			assert.DeepEqual(t, tc.in, before)
		})
	}
}

func TestLoadAvg(t *testing.T) {
	got := LoadAvg()
	if got == "n/a" {
		t.Skip("no /proc/loadavg here")
	}
	assert.Equal(t, len(strings.Fields(got)), 3, got)
}
