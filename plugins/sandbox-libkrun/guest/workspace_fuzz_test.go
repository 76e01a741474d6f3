package guest

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// FuzzWorkspaceUnpack feeds the workspace unpacker arbitrary archives:
// nothing panics, and nothing is ever written outside its directory.
func FuzzWorkspaceUnpack(f *testing.F) {
	for _, entries := range [][]*tar.Header{
		{{Typeflag: tar.TypeDir, Name: "a/", Mode: 0o755}, {Typeflag: tar.TypeReg, Name: "a/b", Mode: 0o644, Size: 1}},
		{{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../../etc"}, {Typeflag: tar.TypeReg, Name: "l/x", Mode: 0o644, Size: 1}},
		{{Typeflag: tar.TypeReg, Name: "../up", Mode: 0o644, Size: 1}},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			_ = tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				_, _ = tw.Write([]byte("x"))
			}
		}
		_ = tw.Close()
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, archive []byte) {
		prune := len(archive)%2 == 0
		base := t.TempDir()
		dir := filepath.Join(base, "ws")
		_, _ = Workspace{}.Unpack(context.Background(), &agentproto.WorkspaceRequest{Dir: dir, Prune: prune, Keep: []string{"keep"}}, bytes.NewReader(archive))
		des, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		for _, de := range des {
			if de.Name() != "ws" {
				t.Fatalf("%s was written outside the workspace", de.Name())
			}
		}
		_ = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err == nil && strings.HasPrefix(filepath.Base(p), ".iii-ws-") {
				t.Fatalf("a temporary file was left: %s", p)
			}
			return nil
		})
	})
}
