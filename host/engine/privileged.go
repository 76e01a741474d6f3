package engine

// FunctionPrivileged reports whether the function id registered in
// namespace ns is privileged: registered with FunctionDef.Privileged, or
// by a socket worker with metadata {"privileged": true}. ok is false when
// no such function is registered. Read-only; the privilege tests use it
// to check every registered function against what they expect.
func (e *Engine) FunctionPrivileged(ns, id string) (privileged, ok bool) {
	f := e.reg.get(ns, id)
	if f == nil {
		return false, false
	}
	return f.privileged, true
}
