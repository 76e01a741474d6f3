// Package benchstat holds the few statistics the benchmark harnesses in
// scripts/bench print: medians, percentiles and the host's load average
// (printed beside results, because the machine is shared).
package benchstat

import (
	"os"
	"slices"
	"strings"
	"time"
)

// Median is the middle sample of s (the upper one of an even count); 0
// for no samples. s is not reordered.
func Median(s []time.Duration) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return c[len(c)/2]
}

// Percentile is the nearest-rank p-th percentile of s (p from 0 to 100):
// the smallest sample with at least p% of the samples at or below it; 0
// for no samples. s is not reordered.
func Percentile(s []time.Duration, p int) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	i := (len(c)*p + 99) / 100
	return c[min(max(i-1, 0), len(c)-1)]
}

// LoadAvg is the 1, 5 and 15 minute load averages of /proc/loadavg, or
// "n/a" where there is none.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}
