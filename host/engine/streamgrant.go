package engine

import (
	"slices"

	"github.com/iii-sandbox/iii/protocol"
)

// StreamDataDenied is the check of the iii-stream worker's functions
// (stream data lives in the default namespace, where they are served): the
// engine token's holder, in-process callers, anonymous loopback workers and
// auth function sessions (whose RBAC already let the call through) keep
// iii 0.26's open stream::*; an issued credential (a VM worker's, a sandbox
// host's) reads and changes stream data only when it grants the default
// namespace itself or names the function, or stream::*, in its allow for
// default. A bare "*" there (what Compose gives VM workers, to call the
// project's open functions) is not a grant of the streams: every item of
// every stream would be readable from inside a VM. nil means allowed.
func (e *Engine) StreamDataDenied(call *Call, id string) *protocol.ErrorBody {
	if call == nil || call.CallerAdmin {
		return nil
	}
	w := e.lookupWorker(call.CallerWorkerID)
	if w == nil || w.principal == nil {
		return &protocol.ErrorBody{Code: CodeForbidden, Message: id + ": the calling worker is gone"}
	}
	return w.principal.streamDenied(id, id)
}

// streamDenied applies StreamDataDenied's rule to p for function id (what
// names the refused thing in the message).
func (p *principal) streamDenied(id, what string) *protocol.ErrorBody {
	if p.admin || p.cred == nil {
		return nil
	}
	if p.cred.scope == nil && !p.cred.queue && slices.Contains(p.session.Declarable, DefaultNamespace) {
		return nil
	}
	if g := p.session.Namespaces[DefaultNamespace]; slices.Contains(g, id) || slices.Contains(g, "stream::*") {
		return nil
	}
	return &protocol.ErrorBody{Code: CodeForbidden, Message: what + ": the credential " + quote(p.cred.label) +
		" does not grant stream data: issue it with allow {\"default\": [\"stream::*\"]} (or the function) to let it read and change streams (docs/security.md)"}
}

// admitStreamTrigger refuses a stream, stream:join or stream:leave trigger
// to a credential that does not grant stream data: the iii-stream worker
// would hand its target every change of a stream (item values included),
// or let it refuse others' joins.
func (p *principal) admitStreamTrigger(triggerType string) *protocol.ErrorBody {
	switch triggerType {
	case "stream", "stream:join", "stream:leave":
		return p.streamDenied("stream::*", "a "+triggerType+" trigger")
	}
	return nil
}
