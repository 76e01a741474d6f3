//go:build linux || darwin

package libkrun

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Error codes of this back end. They are stable: the adapter reports them
// (as S300 with the message) and people search for them.
const (
	// CodeNotFound: no libkrun library in any place searched.
	CodeNotFound = "LIBKRUN_NOT_FOUND"
	// CodeLoad: a file was found but the dynamic loader refused it (not a
	// shared library, wrong architecture, missing dependency).
	CodeLoad = "LIBKRUN_LOAD_FAILED"
	// CodeSymbol: a required symbol is missing or could not be bound.
	CodeSymbol = "LIBKRUN_SYMBOL_MISSING"
	// CodeTooOld: Boot needs a symbol this build lacks (an older release,
	// or a build without BLK=1 / NET=1).
	CodeTooOld = "LIBKRUN_TOO_OLD"
	// CodeBadSpec: the VM description is invalid.
	CodeBadSpec = "LIBKRUN_BAD_SPEC"
	// CodeNoKVM: /dev/kvm is missing or not readable and writable.
	CodeNoKVM = "LIBKRUN_NO_KVM"
	// CodeConfig: a krun_* configuration call returned a negative errno.
	CodeConfig = "LIBKRUN_CONFIG_FAILED"
	// CodeStart: krun_start_enter returned, so the VM did not start.
	CodeStart = "LIBKRUN_START_FAILED"
	// CodeHost: a host resource (socketpair, console log, rlimit) failed.
	CodeHost = "LIBKRUN_HOST_SETUP"
	// CodeUnsupported: this operating system has no libkrun.
	CodeUnsupported = "LIBKRUN_UNSUPPORTED_OS"
)

// Error is a failure of this back end.
type Error struct {
	Code    string
	Message string
	// Call is the libkrun function that failed (CodeConfig, CodeStart).
	Call string
	// Errno is the error it returned, as a positive errno.
	Errno syscall.Errno
	// Tried lists every place Open looked, with why each failed
	// (CodeNotFound, CodeLoad).
	Tried []string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Code)
	b.WriteString(": ")
	if e.Call != "" {
		fmt.Fprintf(&b, "%s returned -%s (%s)", e.Call, errnoName(e.Errno), e.Errno.Error())
		if e.Message != "" {
			b.WriteString(": ")
		}
	}
	b.WriteString(e.Message)
	if len(e.Tried) > 0 {
		b.WriteString("\nplaces searched:")
		for _, t := range e.Tried {
			b.WriteString("\n  ")
			b.WriteString(t)
		}
	}
	return b.String()
}

// Is lets errors.Is match on the code: errors.Is(err, &Error{Code: CodeNoKVM}).
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

func errnoName(e syscall.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return fmt.Sprintf("%d", int(e))
}

// callError turns a negative return of a krun_* call into an *Error.
func callError(code, call string, ret int32, hint string) *Error {
	return &Error{Code: code, Call: call, Errno: syscall.Errno(-ret), Message: hint}
}

// installHint says how to get libkrun, per OS.
func installHint(goos string) string {
	if goos == "darwin" {
		return "install libkrun 1.17 or newer (`brew install libkrun`, or build containers/libkrun with `make BLK=1 NET=1 && sudo make install`), " +
			"or set libkrun_path in the adapter config or III_LIBKRUN_PATH to the dylib"
	}
	return "install libkrun 1.17 or newer built with BLK=1 NET=1 (your distribution's libkrun package, or build containers/libkrun with " +
		"`make BLK=1 NET=1 && sudo make install`, or copy libkrun.so.1 into ~/.iii/lib), " +
		"or set libkrun_path in the adapter config or III_LIBKRUN_PATH to the library; otherwise use hypervisor: qemu"
}
