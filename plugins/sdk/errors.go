package sdk

import (
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit/fsops"
)

// The error helpers below are thin wrappers over package contract, which
// owns the S-code table: an adapter author builds every error a caller sees
// from here and never spells a type, docs URL or retryable flag by hand.

// Errorf returns the sandbox error of code with a formatted message. The
// type, docs_url, retryable flag and default fix_note come from the
// contract's S-code table.
func Errorf(code contract.Code, format string, args ...any) *contract.Error {
	return contract.NewError(code, format, args...)
}

// WithFix returns a copy of err that carries fix, a patch callers merge
// into their original request and resubmit. note replaces the fix_note
// when not empty; otherwise the code's standard "merge `fix`" note is used.
func WithFix(err *contract.Error, fix map[string]any, note string) *contract.Error {
	out := err.WithFix(fix)
	if note != "" {
		out = out.WithFixNote(note)
	}
	return out
}

// ParentsFix is S211's machine fix: resubmit with parents: true.
func ParentsFix() map[string]any { return contract.ParentsFix() }

// ParentNotFound is S211 for a write or mkdir whose parent directory is
// missing; it carries fix {"parents": true}.
func ParentNotFound(path string) *contract.Error { return contract.ParentNotFound(path) }

// AsError returns err as a sandbox error: err itself when it is (or wraps)
// a *contract.Error, else an error of fallback carrying err's text.
func AsError(err error, fallback contract.Code) *contract.Error {
	return contract.AsError(err, fallback)
}

// IsCode reports whether err is (or wraps) a sandbox error of code.
func IsCode(err error, code contract.Code) bool { return contract.IsCode(err, code) }

// FsError maps an error from a filesystem call on path to the S-code the
// contract gives it, so every adapter reports the same code for the same
// state of the filesystem (see fsops.Error for the table). path is the
// sandbox path the caller named, not a host path: messages must not leak
// where an adapter keeps its files.
func FsError(path string, err error) error { return fsops.Error(path, err) }
