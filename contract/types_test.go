package contract

import (
	"encoding/json"
	"io/fs"
	"strings"
	"testing"

	"github.com/iii-sandbox/iii/protocol"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"
)

func ptr[T any](v T) *T { return &v }

// TestResponseJSONGolden pins the JSON of every reply: field names, which
// keys are always present, null exit codes, empty lists as [], modes as
// octal strings, run's sandbox_id only when kept.
func TestResponseJSONGolden(t *testing.T) {
	cases := map[string]any{
		"create":        CreateResponse{SandboxID: "1b4e6709-f265-4142-9178-3a7d83b46aa5", Image: "python"},
		"exec":          ExecResponse{Stdout: "a && b <c>\n", Stderr: "", ExitCode: ptr(0), DurationMS: 12, Success: true},
		"exec-killed":   ExecResponse{Stdout: "x", StdoutTruncated: true, StderrTruncated: true, DurationMS: 300000},
		"run":           RunResponse{ExecResponse: ExecResponse{Stdout: "4\n", ExitCode: ptr(0), DurationMS: 40, Success: true}},
		"run-kept":      RunResponse{ExecResponse: ExecResponse{ExitCode: ptr(1), TimedOut: true}, SandboxID: "1b4e6709-f265-4142-9178-3a7d83b46aa5"},
		"list-empty":    ListResponse{},
		"list":          ListResponse{Sandboxes: []ListEntry{{SandboxID: "a", Image: "node", AgeSecs: 5, ExecInFlight: 1, ExecInProgress: true, ExecSlotsFree: 3}, {SandboxID: "b", Name: "named", Image: "python", Stopped: true}}},
		"stop":          StopResponse{SandboxID: "a", Stopped: true},
		"catalog-empty": CatalogListResponse{},
		"catalog":       CatalogListResponse{Images: []CatalogImage{{Name: "python", OCIRef: "docker.io/iiidev/python:latest", Kind: KindPreset}, {Name: "mine", OCIRef: "ghcr.io/me/mine:1", Kind: KindCustom}}},
		"fs-ls-empty":   FsLsResponse{},
		"fs-ls":         FsLsResponse{Entries: []FsEntry{{Name: "bin", IsDir: true, Size: 4096, Mode: 0o755, Mtime: 1700000000}, {Name: "sh", Mode: 0o777, IsSymlink: true}}},
		"fs-stat":       FsEntry{Name: "main.py", Size: 9, Mode: 0o644, Mtime: 1700000000},
		"fs-mkdir":      FsMkdirResponse{Created: true},
		"fs-write":      FsWriteResponse{BytesWritten: 9, Path: "/work/main.py"},
		"fs-read":       FsReadResponse{Content: protocol.StreamChannelRef{ChannelID: "c", AccessKey: "k", Direction: "read"}, Body: ptr("print(1)\n"), Size: 9, Mode: 0o644, Mtime: 1700000000},
		"fs-read-large": FsReadResponse{Content: protocol.StreamChannelRef{ChannelID: "c", AccessKey: "k", Direction: "read"}, Size: 5 << 20, Mode: 0o600},
		"fs-rm":         FsRmResponse{Removed: true},
		"fs-chmod":      FsChmodResponse{Updated: 3},
		"fs-mv":         FsMvResponse{Moved: true},
		"fs-grep-empty": FsGrepResponse{},
		"fs-grep":       FsGrepResponse{Matches: []GrepMatch{{Path: "/a.py", Line: 2, Content: "print(2)"}}, Truncated: true},
		"fs-sed-empty":  FsSedResponse{},
		"fs-sed":        FsSedResponse{Results: []SedResult{{Path: "/a", Replacements: 2, Success: true}, {Path: "/b", Error: "permission denied"}}, TotalReplacements: 2},
		"adapter-info":  AdapterInfo{Adapter: "sandbox-libkrun", AdapterVersion: "0.2.2", Contract: Current(), Facts: map[string]any{"hypervisor": "qemu", "accel": "tcg", "adapter": "ignored"}},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := EncodeJSON(v)
			assert.NilError(t, err)
			golden.Assert(t, string(b)+"\n", "json/"+name+".json")
		})
	}
}

func TestModeParse(t *testing.T) {
	cases := []struct {
		in   string
		want Mode
		bad  bool
	}{
		{in: "0644", want: 0o644},
		{in: "644", want: 0o644},
		{in: "0o755", want: 0o755},
		{in: "0O700", want: 0o700},
		{in: "4755", want: 0o4755},
		{in: "07777", want: 0o7777},
		{in: "0", want: 0},
		{in: "", bad: true},
		{in: "0o", bad: true},
		{in: "0648", bad: true},
		{in: "10000", bad: true},
		{in: "-644", bad: true},
		{in: " 644", bad: true},
		{in: "0000000644", bad: true},
		{in: "rwxr-xr-x", bad: true},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			m, err := ParseMode(tc.in)
			if tc.bad {
				assert.Assert(t, err != nil, "parsed %q as %v", tc.in, m)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, m, tc.want)
		})
	}
	assert.Equal(t, Mode(0o644).String(), "0644")
	assert.Equal(t, Mode(0o4755).String(), "4755")
	assert.Equal(t, Mode(0).String(), "0000")

	var m Mode
	assert.NilError(t, json.Unmarshal([]byte(`"0o750"`), &m))
	assert.Equal(t, m, Mode(0o750))
	assert.ErrorContains(t, json.Unmarshal([]byte(`420`), &m), "octal string")
}

func TestModeFromFileMode(t *testing.T) {
	assert.Equal(t, ModeFromFileMode(0o644), Mode(0o644))
	assert.Equal(t, ModeFromFileMode(fs.ModeDir|0o755), Mode(0o755))
	assert.Equal(t, ModeFromFileMode(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky|0o700), Mode(0o7700))
}

func TestAdapterInfoJSONRoundTrip(t *testing.T) {
	in := AdapterInfo{Adapter: "a", AdapterVersion: "1.2.3", Contract: ContractVersion{Major: 1, Minor: 1},
		Facts: map[string]any{"hypervisor": "qemu", "vcpus": float64(2), "nested": map[string]any{"k": []any{"v"}}}}
	b, err := json.Marshal(in)
	assert.NilError(t, err)
	var out AdapterInfo
	assert.NilError(t, json.Unmarshal(b, &out))
	assert.DeepEqual(t, out, in)

	var bad AdapterInfo
	assert.ErrorContains(t, json.Unmarshal([]byte(`{"contract":"1.1"}`), &bad), `key "contract"`)
}

func TestInlineBody(t *testing.T) {
	assert.Equal(t, *InlineBody([]byte("hi")), "hi")
	assert.Equal(t, *InlineBody(nil), "")
	assert.Assert(t, InlineBody([]byte{0xff, 0xfe}) == nil, "binary is not inlined")
	assert.Assert(t, InlineBody([]byte(strings.Repeat("a", InlineBodyLimit))) == nil, "1 MiB is not inlined")
	assert.Assert(t, InlineBody([]byte(strings.Repeat("a", InlineBodyLimit-1))) != nil)
}

func TestRunInterpreter(t *testing.T) {
	cases := []struct{ lang, interp, file string }{
		{"node", "node", "/tmp/run.js"}, {"js", "node", "/tmp/run.js"}, {"javascript", "node", "/tmp/run.js"},
		{"python", "python3", "/tmp/run.py"}, {"py", "python3", "/tmp/run.py"},
		{"shell", "/bin/sh", "/tmp/run.sh"}, {"sh", "/bin/sh", "/tmp/run.sh"}, {"bash", "/bin/sh", "/tmp/run.sh"},
		{"/usr/bin/ruby", "/usr/bin/ruby", "/tmp/run.txt"},
	}
	for _, tc := range cases {
		interp, file := RunInterpreter(tc.lang)
		assert.Equal(t, interp, tc.interp, tc.lang)
		assert.Equal(t, file, tc.file, tc.lang)
	}
}

func TestVersions(t *testing.T) {
	ops := Ops()
	assert.Equal(t, len(ops), 16)
	ops[0] = "changed"
	assert.Equal(t, Ops()[0], OpCreate, "Ops returns a fresh slice")
	fs := 0
	for _, op := range Ops() {
		if IsFsOp(op) {
			fs++
		}
	}
	assert.Equal(t, fs, 10)
	assert.Equal(t, RouterFunctionID(OpFsRead), "sandbox::fs::read")
	assert.Equal(t, AdapterFunctionID("sandbox-libkrun", OpAdapterInfo), "sandbox-libkrun::adapter::info")
	assert.Assert(t, CheckContract("a", ContractVersion{Major: 1, Minor: 0}) == nil)
	assert.Assert(t, CheckContract("a", ContractVersion{Major: 1, Minor: 7}) == nil, "a newer minor is additive")
	assert.Equal(t, CheckContract("a", ContractVersion{Major: 2}).Code, S302)
	assert.Equal(t, CheckContract("a", ContractVersion{}).Code, S302)
}

// FuzzAdapterInfoJSON: hosts parse adapter::info from adapters that are
// plain WebSocket workers, so the flat-object decoder must never panic, and
// what it accepts must encode back to an equal value.
func FuzzAdapterInfoJSON(f *testing.F) {
	f.Add([]byte(`{"adapter":"a","adapter_version":"1","contract":{"major":1,"minor":1},"hypervisor":"qemu"}`))
	f.Add([]byte(`{"contract":{"major":-1}}`))
	f.Add([]byte(`{"x":[1,{"y":null}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var a AdapterInfo
		if json.Unmarshal(data, &a) != nil {
			return
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatalf("cannot re-encode %#v: %v", a, err)
		}
		var back AdapterInfo
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("re-encoded info %s does not decode: %v", b, err)
		}
		b2, _ := json.Marshal(back)
		if string(b) != string(b2) {
			t.Fatalf("round trip changed the info:\n%s\n%s", b, b2)
		}
	})
}
