package contract

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestHostFunctionID(t *testing.T) {
	assert.Equal(t, HostFunctionID("sandbox-libkrun", "h1", OpExec), "sandbox-libkrun::host::h1::exec")
	for id, want := range map[string]string{
		"sandbox-libkrun::host::h1::exec":        "h1",
		"sandbox-libkrun::host::rack-7::exec":    "rack-7",
		"sandbox-libkrun::host::::exec":          "",
		"sandbox-libkrun::host::H1::exec":        "",
		"sandbox-libkrun::host::a::b::exec":      "",
		"sandbox-libkrun::exec":                  "",
		"other::host::h1::exec":                  "",
		"sandbox-libkrun::host::h1::fs::exec":    "",
		"sandbox-libkrun::host::h1::exec::extra": "",
	} {
		assert.Check(t, HostOfFunctionID("sandbox-libkrun", OpExec, id) == want, id)
	}
	assert.Check(t, !ValidHostName(strings.Repeat("a", 64)) && ValidHostName(strings.Repeat("a", 63)))
}

func FuzzHostOfFunctionID(f *testing.F) {
	f.Add("a", "h1", "exec")
	f.Add("sandbox-libkrun", "h-2", "fs::read")
	f.Fuzz(func(t *testing.T, adapter, host, op string) {
		got := HostOfFunctionID(adapter, op, HostFunctionID(adapter, host, op))
		if ValidHostName(host) && got != host {
			t.Fatalf("host %q of adapter %q op %q came back as %q", host, adapter, op, got)
		}
		if got != "" && !ValidHostName(got) {
			t.Fatalf("an invalid host name %q came out", got)
		}
	})
}
