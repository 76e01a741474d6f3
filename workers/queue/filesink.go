package queue

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// fileSink is the log as a file, queue.log, in a directory only one
// worker holds (an flock on LOCK).
type fileSink struct {
	dir   string
	f     *os.File // append handle
	lock  *os.File
	dirty bool
}

func openFileSink(dir string) (*fileSink, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the queue directory %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", filepath.Join(dir, lockName), err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("another queue worker uses %s (its LOCK is held): give each queue worker its own file_path", dir)
	}
	return &fileSink{dir: dir, lock: lock}, nil
}

func (k *fileSink) path() string  { return filepath.Join(k.dir, logName) }
func (k *fileSink) where() string { return k.path() }

func (k *fileSink) load() ([]byte, error) {
	b, err := os.ReadFile(k.path())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read the queue log %s: %w", k.path(), err)
	}
	return b, nil
}

func (k *fileSink) appendRecords(recs [][]byte) error {
	_, err := k.f.Write(bytes.Join(recs, nil))
	k.dirty = true
	return err
}

// rewrite writes recs to a new file, fsyncs it and renames it in place.
func (k *fileSink) rewrite(recs [][]byte) error {
	tmp := k.path() + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(bytes.Join(recs, nil)); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	f.Close()
	if err := os.Rename(tmp, k.path()); err != nil {
		return err
	}
	if d, err := os.Open(k.dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	nf, err := os.OpenFile(k.path(), os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if k.f != nil {
		k.f.Close()
	}
	k.f, k.dirty = nf, false
	return nil
}

func (k *fileSink) sync() error {
	if k.f == nil || !k.dirty {
		return nil
	}
	k.dirty = false
	return k.f.Sync()
}

func (k *fileSink) close() error {
	var err error
	if k.f != nil {
		err = k.f.Close()
	}
	k.lock.Close()
	return err
}
