// Package atomicfile replaces a small file so that readers see either
// the old contents or the new, never a part: the data goes to a temporary
// file beside the target, is synced, and is renamed over it.
package atomicfile

import (
	"errors"
	"io/fs"
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
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	// The rename itself is durable only once the directory is synced.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// Create stores data at path with mode perm only if path does not exist
// yet, and reports whether it did: the data goes to a synced temporary
// file beside path, which is then hard-linked to path. The link fails when
// path exists, so of several processes creating the same file at once
// exactly one creates it, and every reader sees it whole. created is false
// (and err nil) when path already existed; the existing file is left as
// it is. Where the file system has no hard links, it falls back to an
// exclusive create (O_EXCL), which still lets only one writer win.
func Create(path string, data []byte, perm os.FileMode) (created bool, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return false, err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	err = os.Link(tmp.Name(), path)
	switch {
	case err == nil:
		syncDir(filepath.Dir(path))
		return true, nil
	case errors.Is(err, fs.ErrExist):
		return false, nil
	}
	// No hard links here: create exclusively and write in place.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return true, err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return true, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return true, err
	}
	return true, f.Close()
}

// syncDir makes a new directory entry durable where the file system can
// sync a directory; where it cannot, the entry is there all the same.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	_ = d.Close()
}
