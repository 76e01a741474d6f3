package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestErrorHelpers(t *testing.T) {
	e := sdk.Errorf(contract.S002, "sandbox %s not found", "abc")
	assert.Equal(t, e.Code, contract.S002)
	assert.Equal(t, e.Type, contract.TypeValidation)
	assert.Equal(t, e.Message, "sandbox abc not found")
	assert.Equal(t, e.DocsURL, contract.DocsURL(contract.S002))
	assert.Check(t, e.Fix == nil)
	assert.Check(t, e.FixNote != "")

	p := sdk.ParentNotFound("/a/b/c")
	assert.Equal(t, p.Code, contract.S211)
	assert.DeepEqual(t, p.Fix, map[string]any{"parents": true})
	assert.DeepEqual(t, sdk.ParentsFix(), map[string]any{"parents": true})

	f := sdk.WithFix(sdk.Errorf(contract.S001, "bad"), map[string]any{"timeout_ms": 1000}, "")
	assert.DeepEqual(t, f.Fix, map[string]any{"timeout_ms": 1000})
	assert.Check(t, is.Contains(f.FixNote, "merge `fix`"))
	g := sdk.WithFix(sdk.Errorf(contract.S001, "bad"), map[string]any{"x": 1}, "set x to 1")
	assert.Equal(t, g.FixNote, "set x to 1")

	wrapped := fmt.Errorf("context: %w", e)
	assert.Check(t, sdk.IsCode(wrapped, contract.S002))
	assert.Equal(t, sdk.AsError(wrapped, contract.S300), e)
	assert.Equal(t, sdk.AsError(errors.New("plain"), contract.S300).Code, contract.S300)
}

// TestFsError produces each filesystem state for real and checks the code
// FsError gives the error the operating system reports.
func TestFsError(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) { t.Helper(); assert.NilError(t, err) }
	must(os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644))
	must(os.Mkdir(filepath.Join(dir, "full"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "full", "f"), []byte("x"), 0o644))
	must(os.Mkdir(filepath.Join(dir, "inside"), 0o755))
	must(os.Symlink("/", filepath.Join(dir, "inside", "escape")))
	root, err := os.OpenRoot(dir)
	must(err)
	defer root.Close()

	tests := []struct {
		name string
		err  func() error
		want contract.Code
	}{
		{"not found", func() error { _, err := root.Stat("missing"); return err }, contract.S211},
		{"component is a file", func() error { _, err := root.Stat("file/below"); return err }, contract.S212},
		{"is a directory", func() error { _, err := root.OpenFile("full", os.O_WRONLY, 0); return err }, contract.S212},
		{"exists", func() error { return root.Mkdir("full", 0o755) }, contract.S213},
		{"not empty", func() error { return root.Remove("full") }, contract.S214},
		{"escapes the root", func() error { _, err := root.Stat("inside/escape/etc"); return err }, contract.S215},
		{"dot-dot escapes the root", func() error { _, err := root.Stat("../x"); return err }, contract.S215},
		{"permission", func() error { return &os.PathError{Op: "open", Path: "/x", Err: syscall.EACCES} }, contract.S215},
		{"read-only", func() error { return &os.PathError{Op: "open", Path: "/x", Err: syscall.EROFS} }, contract.S215},
		{"name too long", func() error { _, err := root.Stat(strings.Repeat("n", 300)); return err }, contract.S216},
		{"I/O", func() error { return &os.PathError{Op: "read", Path: "/x", Err: syscall.EIO} }, contract.S216},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := tc.err()
			assert.Assert(t, raw != nil)
			got := sdk.FsError("/sandbox/path", raw)
			var se *contract.Error
			assert.Assert(t, errors.As(got, &se), "got %v", got)
			assert.Equal(t, se.Code, tc.want, "from %v", raw)
			assert.Check(t, is.Contains(se.Message, "/sandbox/path"))
			assert.Check(t, !strings.Contains(se.Message, dir), "the host path leaked: %s", se.Message)
		})
	}

	t.Run("passes sandbox and context errors through", func(t *testing.T) {
		se := sdk.Errorf(contract.S218, "stream broke")
		assert.Equal(t, sdk.FsError("/p", fmt.Errorf("copy: %w", se)), error(se))
		assert.Check(t, errors.Is(sdk.FsError("/p", context.Canceled), context.Canceled))
		assert.NilError(t, sdk.FsError("/p", nil))
	})
}
