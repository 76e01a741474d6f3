package contract

import (
	"context"
	"encoding/json"
)

// Pause and resume (sandbox::pause, sandbox::resume): an optional
// capability. An adapter that announces CapabilityPause in adapter::info
// implements PauseAdapter; a paused sandbox keeps its memory and files
// (where the adapter keeps them is its own: sandbox-libkrun saves the VM's
// state to a file and ends the VM), answers exec and fs with S005 until
// sandbox::resume, and is listed with paused: true. docs/sandbox-contract.md
// describes them for people.

// Operation names of the pause capability, as they follow "sandbox::" or
// "<adapter>::".
const (
	OpPause  = "pause"
	OpResume = "resume"
)

// CapabilityPause is the adapter::info capability of an adapter that
// serves sandbox::pause and sandbox::resume.
const CapabilityPause = "pause"

// Sandbox states that sandbox::pause and sandbox::resume report.
const (
	SandboxRunning = "running"
	SandboxPaused  = "paused"
)

// PauseOps returns the two operations of the pause capability.
func PauseOps() []string { return []string{OpPause, OpResume} }

// IsPauseOp reports whether op is sandbox::pause or sandbox::resume.
func IsPauseOp(op string) bool { return op == OpPause || op == OpResume }

// PauseAdapter is implemented by adapters that can pause sandboxes.
// Failures should be *Error values: S002 unknown, S004 stopped, S003 while
// an exec or fs operation runs in the sandbox (pause), S006 when this
// sandbox cannot be paused, S300 when saving or restoring failed.
type PauseAdapter interface {
	Pause(ctx context.Context, req *PauseRequest) (*SandboxStatus, error)
	Resume(ctx context.Context, req *ResumeRequest) (*SandboxStatus, error)
}

// PauseRequest is sandbox::pause.
type PauseRequest struct {
	SandboxID string `json:"sandbox_id"`
}

// ResumeRequest is sandbox::resume.
type ResumeRequest struct {
	SandboxID string `json:"sandbox_id"`
}

// SandboxStatus is the reply of sandbox::pause and sandbox::resume: the
// sandbox and its state afterwards (SandboxPaused or SandboxRunning).
type SandboxStatus struct {
	SandboxID string `json:"sandbox_id"`
	Status    string `json:"status"`
}

// PauseUnsupported is the S006 of an adapter without the pause capability.
func PauseUnsupported(adapter, op string) *Error {
	if adapter == "" {
		adapter = "this sandbox adapter"
	} else {
		adapter = "sandbox adapter " + `"` + adapter + `"`
	}
	return NewError(S006, "%s does not support %s%s: it does not announce the %q capability in adapter::info; use sandbox::stop, or an adapter that can pause (sandbox-libkrun under QEMU)",
		adapter, RouterPrefix, op, CapabilityPause)
}

// SandboxPausedError is the S005 of an operation on a paused sandbox.
func SandboxPausedError(id, op string) *Error {
	return NewError(S005, "sandbox %s is paused: call sandbox::resume with its sandbox_id before %s%s", id, RouterPrefix, op)
}

// DecodePauseRequest decodes and validates sandbox::pause.
func DecodePauseRequest(raw json.RawMessage) (*PauseRequest, error) {
	id, e := decodeSandboxOnly(OpPause, raw)
	if e != nil {
		return nil, e
	}
	return &PauseRequest{SandboxID: id}, nil
}

// DecodeResumeRequest decodes and validates sandbox::resume.
func DecodeResumeRequest(raw json.RawMessage) (*ResumeRequest, error) {
	id, e := decodeSandboxOnly(OpResume, raw)
	if e != nil {
		return nil, e
	}
	return &ResumeRequest{SandboxID: id}, nil
}

func decodeSandboxOnly(op string, raw json.RawMessage) (string, *Error) {
	r, e := newRequest(op, raw)
	if e != nil {
		return "", e
	}
	return r.sandboxID()
}
