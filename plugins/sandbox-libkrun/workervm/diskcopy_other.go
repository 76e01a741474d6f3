//go:build !linux

package workervm

import (
	"errors"
	"os"
)

// cloneFile: only Linux's FICLONE is used; elsewhere the disk is copied.
func cloneFile(out, in *os.File) error { return errors.ErrUnsupported }

func copyRange(out, in *os.File, off, n int64) error { return copyRangeBuffered(out, in, off, n) }
