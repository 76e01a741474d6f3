package agentproto

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestWorkerMessages(t *testing.T) {
	for _, m := range []Message{
		&SpawnRequest{Name: "worker", Argv: []string{"/bin/sh", "-c", "x"}, Env: []string{"A=1"}, Workdir: "/workspace"},
		&ProcStopRequest{Name: "install", GraceMS: 5},
		&WorkspaceRequest{Dir: "/workspace", Prune: true, Keep: []string{".iii"}, KeepTop: []string{"node_modules", "dist"}},
	} {
		p, err := EncodeMessage(m)
		assert.NilError(t, err)
		back, err := DecodeMessage(p)
		assert.NilError(t, err)
		assert.DeepEqual(t, back, m)
	}
	for _, bad := range []string{
		`{"type":"spawn","name":"Worker","argv":["x"]}`,
		`{"type":"spawn","name":"w","argv":[]}`,
		`{"type":"spawn","name":"w","argv":["x"],"env":["NOEQUALS"]}`,
		`{"type":"proc_stop","name":"w","grace_ms":-1}`,
		`{"type":"proc_stop","name":""}`,
		`{"type":"workspace","dir":"relative"}`,
		`{"type":"workspace","dir":"/"}`,
		`{"type":"workspace","dir":"/a/../b"}`,
		`{"type":"workspace","dir":"/w","keep":["a/b"]}`,
		`{"type":"workspace","dir":"/w","keep":[".."]}`,
		`{"type":"workspace","dir":"/w","keep_top":["a/b"]}`,
		`{"type":"workspace","dir":"/w","keep_top":[""]}`,
	} {
		_, err := DecodeMessage([]byte(bad))
		assert.Check(t, err != nil, bad)
	}
	assert.Check(t, ValidProcName("a.b_c-9"))
	assert.Check(t, !ValidProcName(""))
}

func TestBootParamsUpper(t *testing.T) {
	p, err := ParseBootParams("iii.root=serial:iii-root iii.upper=serial:iii-upper iii.upper_size=1g")
	assert.NilError(t, err)
	assert.Equal(t, p.Root, "serial:iii-root")
	assert.Equal(t, p.Upper, "serial:iii-upper")
	assert.Equal(t, p.UpperSize, "1g")
	p, err = ParseBootParams("iii.root=/dev/vda iii.upper=/dev/vdb")
	assert.NilError(t, err)
	assert.Equal(t, p.Upper, "/dev/vdb")
	for _, bad := range []string{"iii.upper=vdb", "iii.upper=serial:", "iii.upper=serial:bad/char", "iii.root=serial:" + "x123456789012345678901"} {
		_, err := ParseBootParams(bad)
		assert.Check(t, err != nil, bad)
	}
}
