package workervm

import (
	"strings"
	"time"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
)

// formatTimings is a boot's step timings on one line, in order, for the
// worker's log: "select-backend 1ms, resolve-image 14.2s, ...".
func formatTimings(ts []boot.StepTiming) string {
	if len(ts) == 0 {
		return "none ran"
	}
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.Step + " " + roundDur(t.Duration).String()
	}
	return strings.Join(parts, ", ")
}

// roundDur keeps a duration readable in a log line: milliseconds below a
// second, tenths of a second above.
func roundDur(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}
