package nodesdk

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

const wait = 30 * time.Second

func TestModules(t *testing.T) {
	bare := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(bare, "go.mod"), []byte("module x\n"), 0o644))
	_, err := Modules(bare)
	assert.Check(t, is.ErrorIs(err, ErrNotInstalled))
	_, err = Modules(t.TempDir())
	assert.Check(t, is.ErrorContains(err, "go.mod"))
	assert.Check(t, !errors.Is(err, ErrNotInstalled), "outside a repository is an error, not a skip")
}

// readPack decodes a pack the way unpack.mjs does.
func readPack(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	assert.NilError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	assert.NilError(t, err)
	b, err := io.ReadAll(zr)
	assert.NilError(t, err)
	out := map[string]string{}
	r := bytes.NewReader(b)
	u32 := func() uint32 {
		var v uint32
		assert.NilError(t, binary.Read(r, binary.BigEndian, &v))
		return v
	}
	for r.Len() > 0 {
		name := make([]byte, u32())
		_, err := io.ReadFull(r, name)
		assert.NilError(t, err)
		mode := u32()
		data := make([]byte, u32())
		_, err = io.ReadFull(r, data)
		assert.NilError(t, err)
		out[string(name)] = fmt.Sprintf("%o %s", mode, data)
	}
	return out
}

func fakeModules(t *testing.T) string {
	t.Helper()
	mods := t.TempDir()
	for name, content := range map[string]string{
		"iii-sdk/package.json":       `{"name":"iii-sdk"}`,
		"iii-sdk/dist/index.mjs":     "export const x = 1;\n",
		"iii-sdk/dist/index.mjs.map": "{}",
		"iii-sdk/dist/index.d.ts":    "export {};",
		"iii-sdk/README.md":          "# sdk",
		"@types/node/index.js":       "skipped",
		"undici-types/index.js":      "skipped",
		"ws/bin/run":                 "#!/bin/sh\n",
	} {
		p := filepath.Join(mods, filepath.FromSlash(name))
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	assert.NilError(t, os.Chmod(filepath.Join(mods, "ws", "bin", "run"), 0o755))
	return mods
}

func TestWritePack(t *testing.T) {
	mods := fakeModules(t)
	dst := filepath.Join(t.TempDir(), Pack)
	assert.NilError(t, WritePack(mods, dst))
	assert.DeepEqual(t, readPack(t, dst), map[string]string{
		"iii-sdk/package.json":   `644 {"name":"iii-sdk"}`,
		"iii-sdk/dist/index.mjs": "644 export const x = 1;\n",
		"ws/bin/run":             "755 #!/bin/sh\n",
	})

	assert.Check(t, is.ErrorContains(WritePack(filepath.Join(mods, "missing"), dst), "pack"))
}

// The embedded unpack.mjs, run by node, lays a pack out as node_modules
// with the files' contents and modes: the same step a VM worker's install
// runs in the guest.
func TestUnpackerLaysOutThePack(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	mods := fakeModules(t)
	dir := t.TempDir()
	assert.NilError(t, WriteWorkerFiles(dir, mods))
	cmd := exec.Command(node, Unpacker)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "%s", out)
	assert.Check(t, is.Contains(string(out), "unpacked 3 files into node_modules"))
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "iii-sdk", "dist", "index.mjs"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(b), "export const x = 1;\n"))
	fi, err := os.Stat(filepath.Join(dir, "node_modules", "ws", "bin", "run"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(fi.Mode().Perm(), os.FileMode(0o755)))
	_, err = os.Stat(filepath.Join(dir, "node_modules", "@types"))
	assert.Check(t, os.IsNotExist(err))
}

func fakeSDK(t *testing.T) SDK {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	return SDK{Node: node, URL: "file:///nowhere/index.mjs"}
}

func TestStartLinesAndStop(t *testing.T) {
	s := fakeSDK(t)
	p := s.Start(t, Script{Path: filepath.Join("testdata", "echo.mjs"), RejectNonJSON: true}, map[string]any{"n": 1}, wait)
	first := p.Line(t, wait)
	assert.DeepEqual(t, first, map[string]any{"job": map[string]any{"n": 1.0}, "sdk": s.URL})
	p.Stop(wait)
	select {
	case <-p.Done():
	default:
		t.Fatal("Stop returned before the script exited")
	}
	assert.NilError(t, p.Err())
}

func TestStartSkipsNonJSONUnlessRejected(t *testing.T) {
	s := fakeSDK(t)
	p := s.Start(t, Script{Path: filepath.Join("testdata", "echo.mjs")}, map[string]any{"noise": true, "exit": true}, wait)
	// The noise line is skipped; the job line arrives, then the exit.
	assert.Equal(t, p.Line(t, wait)["job"].(map[string]any)["noise"], true)
	waitfor.Closed(t, p.Done(), wait, "the script to exit after its job line")
	assert.NilError(t, p.Err())
}
