// Package atomicfile replaces a small file so that readers see either
// the old contents or the new, never a part: the data goes to a temporary
// file beside the target, is synced, and is renamed over it.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write stores data at path with mode perm (not filtered by the umask).
// The temporary file is named ".tmp-<base><random>" in path's directory,
// so a crash can leave one behind there but never a torn target.
func Write(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), perm); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
