package config

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// goldenPath is absolute so golden files are found after t.Chdir.
func goldenPath(t *testing.T, name string) string {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join("testdata", name))
	assert.NilError(t, err)
	return abs
}

func TestEnsureFile(t *testing.T) {
	tests := []struct {
		name        string
		interactive bool
		answer      string
		created     bool
		refused     bool
	}{
		{name: "non-interactive creates without asking", interactive: false, created: true},
		{name: "yes", interactive: true, answer: "y\n", created: true},
		{name: "YES with spaces", interactive: true, answer: "  YES \n", created: true},
		{name: "no", interactive: true, answer: "n\n", refused: true},
		{name: "enter means no", interactive: true, answer: "\n", refused: true},
		{name: "end of input means no", interactive: true, answer: "", refused: true},
		{name: "anything else means no", interactive: true, answer: "sure\n", refused: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gp := goldenPath(t, "ensure_declined.golden")
			t.Chdir(t.TempDir())
			var out strings.Builder
			created, err := EnsureFile(context.Background(), "config.yaml", EnsureOptions{
				Interactive: tc.interactive, In: strings.NewReader(tc.answer), Out: &out,
			})
			if tc.interactive {
				assert.Equal(t, out.String(), "config.yaml does not exist. Create it with no workers (workers: [])? [y/N] ")
			} else {
				assert.Equal(t, out.String(), "")
			}
			assert.Equal(t, created, tc.created)
			if tc.refused {
				var ce *Error
				assert.Assert(t, errors.As(err, &ce))
				assert.Equal(t, ce.Code, CodeConfigNotFound)
				golden.Assert(t, err.Error()+"\n", gp)
				_, statErr := os.Stat("config.yaml")
				assert.Assert(t, errors.Is(statErr, os.ErrNotExist))
				return
			}
			assert.NilError(t, err)
			data, err := os.ReadFile("config.yaml")
			assert.NilError(t, err)
			assert.Equal(t, string(data), EmptyFile)
			// What was created must load as a valid, default config.
			cfg, err := Load("config.yaml", nil)
			assert.NilError(t, err)
			assert.Equal(t, len(cfg.Listeners), 1)
		})
	}
}

func TestEnsureFileKeepsExisting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	assert.NilError(t, os.WriteFile(path, []byte("sandbox: {}\n"), 0o644))
	created, err := EnsureFile(context.Background(), path, EnsureOptions{})
	assert.NilError(t, err)
	assert.Assert(t, !created)
	data, _ := os.ReadFile(path)
	assert.Equal(t, string(data), "sandbox: {}\n")
}

func TestEnsureFileMissingDirectory(t *testing.T) {
	gp := goldenPath(t, "ensure_no_directory.golden")
	t.Chdir(t.TempDir())
	_, err := EnsureFile(context.Background(), "nodir/config.yaml", EnsureOptions{})
	golden.Assert(t, err.Error()+"\n", gp)
}

func TestEnsureFileCancelledPrompt(t *testing.T) {
	t.Chdir(t.TempDir())
	r, w := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := EnsureFile(ctx, "config.yaml", EnsureOptions{Interactive: true, In: r})
	assert.ErrorIs(t, err, context.Canceled)
	// Release the reader goroutine the prompt left behind.
	assert.NilError(t, w.Close())
}

func TestReadFileErrors(t *testing.T) {
	missing, directory := goldenPath(t, "read_missing.golden"), goldenPath(t, "read_directory.golden")
	t.Chdir(t.TempDir())
	_, err := Load("missing.yaml", nil)
	golden.Assert(t, err.Error()+"\n", missing)
	assert.NilError(t, os.Mkdir("dir.yaml", 0o755))
	_, err = Load("dir.yaml", nil)
	var ce *Error
	assert.Assert(t, errors.As(err, &ce))
	golden.Assert(t, err.Error()+"\n", directory)
}

func TestLoadResolvesAgainstTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "engine.yaml")
	assert.NilError(t, os.WriteFile(path, []byte("workers:\n  - name: configuration\n    config: { adapter: { config: { directory: ./cfg } } }\n"), 0o644))
	cfg, err := Load(path, nil)
	assert.NilError(t, err)
	assert.Equal(t, cfg.Configuration.Directory, filepath.Join(dir, "cfg"))
	assert.Equal(t, cfg.Dir, dir)

	// A relative path resolves against the working directory's copy.
	t.Chdir(dir)
	cfg, err = Load("engine.yaml", nil)
	assert.NilError(t, err)
	assert.Equal(t, cfg.Configuration.Directory, filepath.Join(dir, "cfg"))
}
