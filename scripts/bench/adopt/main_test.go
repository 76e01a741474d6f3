package main

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// The log capture keeps the adapter's adoption summary, whole lines only
// however the writes split them, and passes on warnings and errors.
func TestLogCapture(t *testing.T) {
	summary := "2026-12-02T16:00:00.000Z [INFO]  sandbox-libkrun: adopted sandboxes: count=8 ms=42"
	kit := "2026-12-02T16:00:00.000Z [INFO]  sandbox-libkrun: adopted the sandboxes an earlier adapter process left: count=8"
	warn := "2026-12-02T16:00:00.000Z [WARN]  sandbox-libkrun: could not adopt a sandbox"
	killed := `2026-12-02T16:38:04.015Z [ERROR] plugin process exited: plugin=/tmp/adb1/bin/sandbox-libkrun id=11821 error="signal: killed"`
	failed := `2026-12-02T16:38:04.015Z [ERROR] plugin process exited: plugin=/tmp/adb1/bin/sandbox-libkrun id=11821 error="exit status 2"`
	for _, tc := range []struct {
		name        string
		writes      []string
		kept, fwded []string
	}{
		{name: "one line per write", writes: []string{summary + "\n", kit + "\n", warn + "\n"}, kept: []string{summary}, fwded: []string{warn}},
		{name: "split across writes", writes: []string{summary[:10], summary[10:] + "\n" + warn[:5], warn[5:] + "\n"}, kept: []string{summary}, fwded: []string{warn}},
		{name: "the harness's own SIGKILL is not reported", writes: []string{killed + "\n", failed + "\n"}, fwded: []string{failed}},
		{name: "no newline yet", writes: []string{summary}},
		{name: "an endless line is dropped", writes: []string{strings.Repeat("x", maxLogLine+1), summary + "\n"}, kept: []string{summary}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fwd strings.Builder
			l := &logCapture{forward: &fwd}
			for _, w := range tc.writes {
				n, err := l.Write([]byte(w))
				assert.NilError(t, err)
				assert.Equal(t, n, len(w))
			}
			assert.Check(t, is.DeepEqual(l.lines(), tc.kept))
			want := ""
			for _, f := range tc.fwded {
				want += f + "\n"
			}
			assert.Check(t, is.Equal(fwd.String(), want))
		})
	}
}
