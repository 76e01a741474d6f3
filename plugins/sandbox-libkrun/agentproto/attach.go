package agentproto

import "errors"

// ProcAttachRequest (protocol 1.4, CapProcAttach) streams the kept process
// Name (SpawnRequest.Keep) on this connection, as its spawn stream did:
// Started (with DroppedBytes), the output kept while no host was attached,
// then its output as it comes, and ExitStatus once it has exited — at once
// when it exited while detached. A process attached elsewhere is taken
// over: the other stream ends with CodeDetached. Cancel on this stream
// kills the process, as on its spawn stream; the connection ending leaves
// it running again. A process that exited stays attachable (its exit
// reported again) until a new spawn takes its name, ProcStop or Cancel:
// the agent learns that a host is gone only when the next one says hello,
// so output and an exit sent in between — at most a flow-control window —
// may have reached nobody.
type ProcAttachRequest struct {
	Name string `json:"name"`
}

// MessageType implements Message.
func (*ProcAttachRequest) MessageType() string { return TypeProcAttach }

// KeptOutputBytes bounds the output a kept process's agent holds while no
// host is attached; older output is dropped (and counted).
const KeptOutputBytes = 1 << 20

// IsCode reports whether err is (or wraps) an agent Error with code.
func IsCode(err error, code string) bool {
	var ae *Error
	return errors.As(err, &ae) && ae.Code == code
}
