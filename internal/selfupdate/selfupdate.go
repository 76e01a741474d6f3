// Package selfupdate is `iii update`: it reads a release source (an
// HTTP(S) site or a local directory holding index.json, docs/update.md),
// picks the latest release or a given one, downloads the archive of the
// host's target triple, verifies its SHA-256 and size, extracts the binary
// and replaces the installed file atomically (a file beside it, fsync,
// rename, the old mode kept). It also finds what iii 0.25 left behind
// (iii-worker, iii-init, VM state) so the command can list it; it never
// deletes any of it. Publish writes a release directory in the same
// format, for `make` and for tests.
//
// Every error a user sees is an *Error with a stable code.
package selfupdate

import (
	"errors"
	"time"
)

// Where releases come from and what overrides it.
const (
	// DefaultSource is the product's release site: the latest GitHub
	// release of the project carries index.json as an asset, and that
	// index lists every release with absolute asset URLs.
	DefaultSource = "https://github.com/iii-sandbox/iii/releases/latest/download"
	// EnvSource overrides DefaultSource (the --source flag overrides both).
	EnvSource = "III_RELEASE_SOURCE"
	// EnvTarget replaces the host's target triple: tests use it to play
	// another host, and a glibc host may pick a musl build with it.
	EnvTarget = "III_RELEASE_TARGET"
	// IndexFile is the file every source serves at its root.
	IndexFile = "index.json"
)

// The products a release may carry. ProductIII is the command itself;
// ProductCloud is updated when its binary sits beside iii.
const (
	ProductIII   = "iii"
	ProductCloud = "iii-cloud"
)

// Limits and time bounds.
const (
	// MaxIndexBytes bounds index.json: it lists versions and digests.
	MaxIndexBytes = 4 << 20
	// MaxArchiveBytes bounds a downloaded archive.
	MaxArchiveBytes = 512 << 20
	// MaxBinaryBytes bounds the binary extracted from it.
	MaxBinaryBytes = 512 << 20
	// IndexTimeout bounds fetching index.json.
	IndexTimeout = 60 * time.Second
	// DownloadTimeout bounds one archive download.
	DownloadTimeout = 30 * time.Minute
	// VersionTimeout bounds running `<binary> --version`.
	VersionTimeout = 30 * time.Second
)

// Stable error codes (docs/update.md lists each with its fix).
const (
	CodeInvalidSource      = "RELEASE_SOURCE_INVALID"
	CodeSourceUnreachable  = "RELEASE_SOURCE_UNREACHABLE"
	CodeIndexInvalid       = "RELEASE_INDEX_INVALID"
	CodeReleaseNotFound    = "RELEASE_NOT_FOUND"
	CodeAssetNotFound      = "RELEASE_ASSET_NOT_FOUND"
	CodeDownloadFailed     = "RELEASE_DOWNLOAD_FAILED"
	CodeDigestMismatch     = "RELEASE_DIGEST_MISMATCH"
	CodeArchiveInvalid     = "RELEASE_ARCHIVE_INVALID"
	CodeBinaryUnusable     = "RELEASE_BINARY_UNUSABLE"
	CodeExecutableUnknown  = "UPDATE_EXECUTABLE_UNKNOWN"
	CodeTargetNotInstalled = "UPDATE_TARGET_NOT_INSTALLED"
	CodeDirNotWritable     = "UPDATE_DIR_NOT_WRITABLE"
	CodeReplaceFailed      = "UPDATE_REPLACE_FAILED"
)

// Error is a failure a user sees: Code is stable (scripts match on it),
// Message says what is wrong and what to do.
type Error struct {
	Code    string
	Message string
}

// Error puts the code first, as every coded error of iii does.
func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Is matches by code, so errors.Is(err, &Error{Code: X}) works.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t != nil && t.Code == e.Code
}

func newError(code, message string) *Error { return &Error{Code: code, Message: message} }

// CodeOf is the code of the first *Error in err's chain, "" when none.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
