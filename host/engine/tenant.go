package engine

import (
	"encoding/json"
	"fmt"
)

// TenantOf names the principal a call speaks for, as the owner of what it
// creates through the sandbox router (docs/security.md, "Who sees what").
// all is true for the engine token's holder and in-process callers: they
// see and act on everything. Otherwise tenant is:
//
//   - "credential:<label>" for an issued credential (a VM worker's
//     "compose/<ns>/<worker>", a sandbox host's), so a VM worker restarted
//     with a new credential of the same label keeps its sandboxes; a
//     credential without a label is its own tenant;
//   - "session:<listener>:<context>" for an auth function's session: the
//     context it returned (compact JSON) identifies the user;
//   - "anonymous" for a loopback connection without a token: the local
//     processes of the user are one tenant;
//   - "worker:<id>" when the calling worker is gone: a tenant nobody is.
func (e *Engine) TenantOf(call *Call) (tenant string, all bool) {
	if call == nil || call.CallerAdmin {
		return "", true
	}
	w := e.lookupWorker(call.CallerWorkerID)
	if w == nil || w.principal == nil {
		return "worker:" + call.CallerWorkerID, false
	}
	p := w.principal
	switch {
	case p.admin:
		return "", true
	case p.cred != nil:
		if p.cred.label != "" {
			return "credential:" + p.cred.label, false
		}
		return fmt.Sprintf("credential:%p", p.cred), false
	case p.kind == "auth-function":
		ctx := []byte("null")
		if p.session != nil && len(p.session.Context) > 0 {
			// Decoded and encoded again: object keys sorted, so the
			// same context is the same tenant however it was written.
			var v any
			if json.Unmarshal(p.session.Context, &v) == nil {
				if b, err := json.Marshal(v); err == nil {
					ctx = b
				}
			}
		}
		name := ""
		if p.policy != nil {
			name = p.policy.Name
		}
		return "session:" + name + ":" + string(ctx), false
	}
	return "anonymous", false
}
