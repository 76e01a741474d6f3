package images

import (
	"errors"
	"fmt"
)

// Stable codes the adapter maps to sandbox S-codes.
const (
	// CodeNotInstalled: the image is not cached and auto_install is off.
	CodeNotInstalled = "S101"
	// CodeInstallFailed: pulling, unpacking or building failed; retryable.
	CodeInstallFailed = "S102"
)

// ErrNotInstalled is matched (errors.Is) by every *NotInstalledError.
var ErrNotInstalled = errors.New("image not installed")

// NotInstalledError: Ensure found no cached or locally loaded image for Ref
// and was not allowed to pull it.
type NotInstalledError struct {
	Ref string
}

func (e *NotInstalledError) Error() string {
	return fmt.Sprintf("image %s is not installed and auto_install is false; pre-load it into the local OCI layout (scripts/build-images.sh does this for the presets) or set auto_install: true", e.Ref)
}

// Is makes errors.Is(err, ErrNotInstalled) true.
func (e *NotInstalledError) Is(target error) bool { return target == ErrNotInstalled }

// Code returns the sandbox S-code.
func (e *NotInstalledError) Code() string { return CodeNotInstalled }

// Phase names a step of an installation.
type Phase string

const (
	PhaseResolving Phase = "resolving"
	PhasePulling   Phase = "pulling"
	PhaseUnpacking Phase = "unpacking"
	PhaseBuilding  Phase = "building"
)

// InstallError: an installation failed. The cache is left as it was
// before the attempt (apart from verified layer blobs kept to resume), so a
// retry is always safe.
type InstallError struct {
	Ref   string
	Phase Phase
	Err   error
}

func (e *InstallError) Error() string {
	return fmt.Sprintf("install image %s: %s failed: %v (retry later)", e.Ref, e.Phase, e.Err)
}

func (e *InstallError) Unwrap() error { return e.Err }

// Retryable is always true: failures come from the network, the registry
// or the local disk, and nothing half done is left behind.
func (e *InstallError) Retryable() bool { return true }

// Code returns the sandbox S-code.
func (e *InstallError) Code() string { return CodeInstallFailed }
