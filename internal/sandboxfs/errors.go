package sandboxfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
)

// Kind is the class of a failure, one per sandbox contract code. Adapters
// map it to their own codes at their edge.
type Kind uint8

const (
	// KindIO is any other I/O failure (S216).
	KindIO Kind = iota
	// KindInvalid is a request that cannot be served as given (S210).
	KindInvalid
	// KindNotFound is a missing path (S211).
	KindNotFound
	// KindWrongType is a file where a directory is needed or the reverse (S212).
	KindWrongType
	// KindExists is a path that already exists (S213).
	KindExists
	// KindNotEmpty is a directory that is not empty (S214).
	KindNotEmpty
	// KindPermission is a refusal: permissions, a read-only filesystem,
	// or a path leaving the sandbox (S215).
	KindPermission
	// KindRegex is an invalid regular expression (S217).
	KindRegex
	// KindAborted is a write whose content stream failed (S218).
	KindAborted
)

// Error is a failed operation. Message names sandbox paths only, never
// where an adapter keeps its files.
type Error struct {
	Kind    Kind
	Message string
	// ParentMissing marks the not-found where the path's parent directory
	// is missing and {"parents": true} would fix a write or mkdir.
	ParentMissing bool
	// Cause is what made a write's content stream fail, so an adapter can
	// pass on an error of its own code space (or a cancellation) as is.
	Cause error
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the cause of an aborted write.
func (e *Error) Unwrap() error { return e.Cause }

func errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...)}
}

// errPathEscapesText is the text of os.Root's refusal to follow a path out
// of its directory. The standard library does not export the error value,
// so its text is the only way to recognise it.
const errPathEscapesText = "path escapes from parent"

// FromOS classifies an error from a filesystem call on the sandbox path p.
// An *Error passes through unchanged, and so does a context's end, so the
// transport can report the caller's own cancellation.
//
//	not found                              KindNotFound
//	not a directory / is a directory       KindWrongType
//	already exists                         KindExists
//	directory not empty                    KindNotEmpty
//	permission denied, read-only, escapes  KindPermission
//	anything else (ENAMETOOLONG, EIO, …)   KindIO
func FromOS(p string, err error) error {
	if err == nil {
		return nil
	}
	var se *Error
	if errors.As(err, &se) {
		return se
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var errno syscall.Errno
	errors.As(err, &errno)
	cause := rootCause(err)
	// Errno cases come first: Go's errno-to-fs.Err mapping folds ENOTEMPTY
	// into fs.ErrExist, which would turn "not empty" into "exists".
	switch {
	case errno == syscall.ENOTEMPTY:
		return errorf(KindNotEmpty, "directory not empty: %s", p)
	case errno == syscall.ENOTDIR:
		return errorf(KindWrongType, "not a directory: %s, or one of its parents, is a file", p)
	case errno == syscall.EISDIR:
		return errorf(KindWrongType, "is a directory: %s", p)
	case errno == syscall.EROFS:
		return errorf(KindPermission, "permission denied: %s is on a read-only filesystem", p)
	case errors.Is(err, fs.ErrNotExist):
		return errorf(KindNotFound, "path not found: %s", p)
	case errors.Is(err, fs.ErrExist):
		return errorf(KindExists, "path already exists: %s", p)
	case errors.Is(err, fs.ErrPermission):
		return errorf(KindPermission, "permission denied: %s", p)
	case cause != nil && cause.Error() == errPathEscapesText:
		return errorf(KindPermission, "permission denied: %s resolves (through a symbolic link or ..) to a place outside the sandbox", p)
	}
	return errorf(KindIO, "%s: %s", p, cause.Error())
}

// rootCause unwraps err to its innermost error, which for an
// *fs.PathError is the errno without the operation and host path.
func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// parentNotFound is the not-found of a path whose parent directory is
// missing.
func parentNotFound(p string, fixable bool) *Error {
	e := errorf(KindNotFound, "parent directory not found: %s", p)
	e.ParentMissing = fixable
	return e
}

func invalid(op, format string, args ...any) *Error {
	return errorf(KindInvalid, "invalid sandbox::fs::%s request: %s", op, fmt.Sprintf(format, args...))
}
