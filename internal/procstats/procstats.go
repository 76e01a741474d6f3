// Package procstats reads the calling process's own runtime figures: its
// goroutines, open file descriptors and resident memory. The engine's
// engine::runtime::stats and every SDK-served adapter's adapter::info
// (its "runtime" block) report them in the same shape, so a soak can
// watch both processes for leaks through the ordinary calls.
package procstats

import "runtime"

// Stats is the "runtime" block. A figure the system cannot tell is -1.
type Stats struct {
	Goroutines int   `json:"goroutines"`
	OpenFDs    int   `json:"open_fds"`
	RSSBytes   int64 `json:"rss_bytes"`
}

// Read samples the calling process. It never fails: what the system does
// not show is -1.
func Read() Stats {
	s := Stats{Goroutines: runtime.NumGoroutine(), OpenFDs: -1, RSSBytes: -1}
	readOS(&s)
	return s
}

// Map is s as a JSON-shaped map, for adapter::info's facts (which travel
// as a map[string]any).
func (s Stats) Map() map[string]any {
	return map[string]any{"goroutines": s.Goroutines, "open_fds": s.OpenFDs, "rss_bytes": s.RSSBytes}
}
