package fsops

import (
	"context"
	"errors"
	"io/fs"
	"syscall"

	"github.com/iii-sandbox/iii/contract"
)

// errPathEscapesText is the text of os.Root's refusal to follow a path out
// of its directory. The standard library does not export the error value,
// so its text is the only way to recognise it.
const errPathEscapesText = "path escapes from parent"

// Error maps an error from a filesystem call on path to the S-code the
// contract gives it, so every adapter reports the same code for the same
// state of the filesystem:
//
//	not found                              S211
//	not a directory / is a directory       S212
//	already exists                         S213
//	directory not empty                    S214
//	permission denied, read-only, escapes  S215
//	anything else (ENAMETOOLONG, EIO, …)   S216
//
// A sandbox error passes through unchanged, and a context error is
// returned as is so the transport reports the caller's own cancellation.
// path is the sandbox path the caller named, not a host path: messages
// must not leak where an adapter keeps its files.
func Error(path string, err error) error {
	if err == nil {
		return nil
	}
	var se *contract.Error
	if errors.As(err, &se) {
		return se
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	cause := rootCause(err)
	var errno syscall.Errno
	errors.As(err, &errno)
	// Errno cases come first: Go's errno-to-fs.Err mapping folds ENOTEMPTY
	// into fs.ErrExist, which would turn S214 into S213.
	switch {
	case errno == syscall.ENOTEMPTY:
		return contract.NewError(contract.S214, "directory not empty: %s", path)
	case errno == syscall.ENOTDIR:
		return contract.NewError(contract.S212, "not a directory: %s, or one of its parents, is a file", path)
	case errno == syscall.EISDIR:
		return contract.NewError(contract.S212, "is a directory: %s", path)
	case errno == syscall.EROFS:
		return contract.NewError(contract.S215, "permission denied: %s is on a read-only filesystem", path)
	case errors.Is(err, fs.ErrNotExist):
		return contract.NewError(contract.S211, "path not found: %s", path)
	case errors.Is(err, fs.ErrExist):
		return contract.NewError(contract.S213, "path already exists: %s", path)
	case errors.Is(err, fs.ErrPermission):
		return contract.NewError(contract.S215, "permission denied: %s", path)
	case cause != nil && cause.Error() == errPathEscapesText:
		return contract.NewError(contract.S215, "permission denied: %s resolves (through a symbolic link or ..) to a place outside the sandbox", path)
	}
	return contract.NewError(contract.S216, "%s: %s", path, describe(cause))
}

// rootCause unwraps err to its innermost error.
func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// describe names an errno the way strerror does, without the operation and
// host path an *fs.PathError would add.
func describe(err error) string {
	if err == nil {
		return "I/O error"
	}
	return err.Error()
}
