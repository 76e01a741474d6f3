package fsops

import (
	"context"
	"errors"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/sandboxfs"
)

// code maps the shared implementation's kinds to the contract's codes.
func code(k sandboxfs.Kind) contract.Code {
	switch k {
	case sandboxfs.KindInvalid:
		return contract.S210
	case sandboxfs.KindNotFound:
		return contract.S211
	case sandboxfs.KindWrongType:
		return contract.S212
	case sandboxfs.KindExists:
		return contract.S213
	case sandboxfs.KindNotEmpty:
		return contract.S214
	case sandboxfs.KindPermission:
		return contract.S215
	case sandboxfs.KindRegex:
		return contract.S217
	case sandboxfs.KindAborted:
		return contract.S218
	}
	return contract.S216
}

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
	return toContract(sandboxfs.FromOS(path, err))
}

// toContract turns an error of the shared implementation into the
// contract's. A contract error or a context error inside it (the write
// content's reader failed with one) passes through.
func toContract(err error) error {
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
	var fe *sandboxfs.Error
	if !errors.As(err, &fe) {
		return contract.NewError(contract.S216, "%v", err)
	}
	return fromShared(fe)
}

func fromShared(fe *sandboxfs.Error) *contract.Error {
	e := contract.NewError(code(fe.Kind), "%s", fe.Message)
	if fe.ParentMissing {
		e = e.WithFix(contract.ParentsFix())
	}
	return e
}
