package agentproto

import "fmt"

// Error codes. Filesystem and request-validation failures use the sandbox
// contract's S-codes so the adapter passes them through unchanged; the
// AGENT_* codes are about the agent channel itself and the adapter turns
// them into a platform error.
const (
	CodeInvalidRequest = "S001" // exec request the agent cannot run (bad workdir, ...)

	CodeFSInvalid     = "S210" // invalid fs request (exclusive fields, missing field, bad mode)
	CodeFSNotFound    = "S211" // path (or, with ParentMissing, its parent) missing
	CodeFSWrongType   = "S212" // file where a directory is needed, or the reverse
	CodeFSExists      = "S213" // path exists
	CodeFSNotEmpty    = "S214" // directory not empty
	CodeFSPermission  = "S215" // permission denied, read-only filesystem
	CodeFSIO          = "S216" // any other I/O error
	CodeFSRegex       = "S217" // invalid regular expression
	CodeFSAborted     = "S218" // a streamed read or write was cut off
	CodeFSUnsupported = "S219" // the agent does not serve this fs op

	CodeProtocolMismatch = "AGENT_PROTOCOL_MISMATCH" // protocol majors differ
	CodeProtocol         = "AGENT_PROTOCOL_ERROR"    // a peer broke the framing or message rules
	CodeUnsupported      = "AGENT_UNSUPPORTED"       // the agent lacks the capability
	CodeDisconnected     = "AGENT_DISCONNECTED"      // the channel closed mid-operation
	CodeInternal         = "AGENT_INTERNAL"          // the agent failed (pipes, fork, ...)
	CodeNetFailed        = "AGENT_NET_FAILED"        // network configuration failed
	CodeCanceled         = "AGENT_CANCELED"          // the host canceled the operation
	CodeNoProcess        = "AGENT_NO_PROCESS"        // proc_attach: no kept process of that name
	CodeDetached         = "AGENT_DETACHED"          // a kept process was attached on another stream
)

// Error is the terminal "error" message of a stream, and the error the
// agentclient returns for it.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// ParentMissing marks the S211 variant where the path's parent
	// directory is missing: the adapter adds fix {"parents": true}.
	ParentMissing bool `json:"parent_missing,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf builds an *Error.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
