package contract

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/icmd"
)

// withoutProtocVersion drops the header lines that record protoc's own
// version, so a machine with another Debian protoc patch release does not
// count as stale.
func withoutProtocVersion(src string) string {
	var keep []string
	for _, line := range strings.Split(src, "\n") {
		if strings.HasPrefix(line, "// \tprotoc ") || strings.HasPrefix(line, "// - protoc ") {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n")
}

// TestGeneratedCodeIsFresh regenerates contract/proto into a temporary
// directory with the pinned generators and fails if the committed code
// differs: someone edited sandbox.proto without running scripts/proto.sh.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the pinned code generators")
	}
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Skip("protoc is not installed (Debian package protobuf-compiler)")
	}
	out := t.TempDir()
	res := icmd.RunCmd(icmd.Command("bash", "../scripts/proto.sh", "contract"),
		icmd.WithEnv(append(os.Environ(), "PROTO_OUT="+out)...))
	res.Assert(t, icmd.Success)

	fresh, err := filepath.Glob(filepath.Join(out, "*.go"))
	assert.NilError(t, err)
	committed, err := filepath.Glob("proto/*.go")
	assert.NilError(t, err)
	assert.Equal(t, len(fresh), len(committed), "generated files: %v, committed: %v", fresh, committed)
	for _, f := range fresh {
		want, err := os.ReadFile(f)
		assert.NilError(t, err)
		got, err := os.ReadFile(filepath.Join("proto", filepath.Base(f)))
		assert.NilError(t, err, "generated %s is not committed", filepath.Base(f))
		assert.Assert(t, withoutProtocVersion(string(got)) == withoutProtocVersion(string(want)),
			"contract/proto/%s is stale: run scripts/proto.sh", filepath.Base(f))
	}
}
